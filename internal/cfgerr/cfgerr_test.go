package cfgerr_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/cfgerr"
)

func TestList(t *testing.T) {
	var none cfgerr.List
	if err := none.Err(); err != nil {
		t.Fatalf("empty list: %v", err)
	}

	var one cfgerr.List
	one.Add("A", "bad")
	var ce *idemq.ConfigError
	if err := one.Err(); !errors.As(err, &ce) || ce.Field != "A" || err.Error() != "idemq: invalid configuration: A: bad" {
		t.Fatalf("one error: %v", err)
	}

	nested := cfgerr.List{Prefix: "pkg.Config."}
	nested.Add("B", "worse")
	nested.Addf("C", "%d is odd", 3)
	cause := errors.New("cause")
	nested.AddErr("E", "", cause)
	l := cfgerr.List{Prefix: "ignored."}
	l.Include(one.Err())
	l.Include(nested.Err())
	l.Include(fmt.Errorf("wrapped: %w", &idemq.ConfigError{Field: "D", Reason: "x"}))
	l.Include(nil)
	err := l.Err()
	if !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Errorf("%v does not match ErrInvalidConfig", err)
	}
	if !errors.Is(err, cause) {
		t.Errorf("%v does not wrap its cause", err)
	}
	if got, want := cfgerr.Fields(err), []string{"A", "pkg.Config.B", "pkg.Config.C", "pkg.Config.E", "D"}; !slices.Equal(got, want) {
		t.Errorf("Fields = %q, want %q", got, want)
	}
	want := "idemq: invalid configuration: A: bad; pkg.Config.B: worse; pkg.Config.C: 3 is odd; pkg.Config.E: cause; wrapped: idemq: invalid configuration: D: x"
	if err.Error() != want {
		t.Errorf("Error() =\n%s\nwant\n%s", err, want)
	}
}

func TestBounds(t *testing.T) {
	l := cfgerr.List{Prefix: "p."}
	if !l.NotNegative("Zero", 0) || l.NotNegative("Neg", -time.Nanosecond) {
		t.Error("NotNegative reports 0 invalid or -1ns valid")
	}
	if !l.Positive("One", 1) || l.Positive("Zero", 0) {
		t.Error("Positive reports 1 invalid or 0 valid")
	}
	want := "idemq: invalid configuration: p.Neg: must not be negative; p.Zero: must be at least 1"
	if err := l.Err(); err == nil || err.Error() != want {
		t.Errorf("Err() = %v, want %s", err, want)
	}
}
