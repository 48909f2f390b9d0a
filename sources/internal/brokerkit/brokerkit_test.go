package brokerkit

import (
	"context"
	"errors"
	"testing"
	"time"
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
