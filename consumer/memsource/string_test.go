package memsource_test

import (
	"fmt"
	"testing"

	"github.com/idemq/idemq/consumer/memsource"
)

// String names the topic for the Runner's start line.
func TestSourceString(t *testing.T) {
	b := memsource.New(memsource.Config{})
	defer b.Close()
	s, ok := any(b.Source("orders")).(fmt.Stringer)
	if !ok {
		t.Fatal("*memsource.Source has no String method")
	}
	if got, want := s.String(), "memsource topic=orders"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
