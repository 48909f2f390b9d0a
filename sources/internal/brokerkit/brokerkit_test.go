package brokerkit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
)

// A wait that the context ended reports the context's error, and the last
// error of the check only when there was one.
func TestPollEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Poll(ctx, time.Millisecond, func() (bool, error) { return false, nil }); err.Error() != context.Canceled.Error() {
		t.Errorf("Poll without a check error = %q, want %q", err, context.Canceled)
	}
	last := errors.New("leader not available")
	err := Poll(ctx, time.Millisecond, func() (bool, error) { return false, last })
	if !errors.Is(err, context.Canceled) || !errors.Is(err, last) {
		t.Errorf("Poll with a check error = %v, want both errors wrapped", err)
	}
}

// Poll returns nil once the check reports true, calling it until then.
func TestPollDone(t *testing.T) {
	calls := 0
	err := Poll(context.Background(), time.Millisecond, func() (bool, error) {
		calls++
		return calls == 3, errors.New("not yet")
	})
	if err != nil || calls != 3 {
		t.Errorf("Poll = %v after %d calls, want nil after 3", err, calls)
	}
}

// Warnings logs the first failures in a row, then one a reminder period.
func TestWarnings(t *testing.T) {
	var w Warnings
	for n := 1; n <= warnEach; n++ {
		if !w.Due(n) {
			t.Fatalf("failure %d not due", n)
		}
	}
	if w.Due(warnEach + 1) {
		t.Fatalf("failure %d due right after the last warning", warnEach+1)
	}
	w.last = time.Now().Add(-time.Hour)
	if !w.Due(warnEach + 2) {
		t.Fatalf("failure %d not due an hour after the last warning", warnEach+2)
	}
}

// A dead letter records the attempts and key of the runner's
// DeadLetterError, the message's key when the error has none, and the
// message's own without one.
func TestRecorded(t *testing.T) {
	reason := fmt.Errorf("wrapped: %w", &consumer.DeadLetterError{Key: "k1", Attempts: 5, Err: errors.New("boom")})
	if a, k := Recorded(reason, 1, "k0"); a != 5 || k != "k1" {
		t.Errorf("Recorded(DeadLetterError) = %d, %q; want 5, k1", a, k)
	}
	if a, k := Recorded(&consumer.DeadLetterError{Attempts: 2}, 1, "k0"); a != 2 || k != "k0" {
		t.Errorf("Recorded(DeadLetterError without key) = %d, %q; want 2, k0", a, k)
	}
	if a, k := Recorded(errors.New("boom"), 3, "k0"); a != 3 || k != "k0" {
		t.Errorf("Recorded(plain error) = %d, %q; want 3, k0", a, k)
	}
	if got := ReasonText(nil, 10); got != "unknown" {
		t.Errorf("ReasonText(nil) = %q, want unknown", got)
	}
	if got := ReasonText(errors.New("a\x01b"), 0); got != `a\x01b` {
		t.Errorf("ReasonText(control character) = %q, want it escaped", got)
	}
}
