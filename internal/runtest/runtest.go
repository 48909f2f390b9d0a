// Package runtest holds the helpers idemq's own tests share: running
// Runners, waiting for a condition, a test logger, unique names for topics
// and queues. One helper per check, used by every package.
package runtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Timeout is how long RunUntil waits for its condition.
const Timeout = 60 * time.Second

// Runner is what the helpers run: a *consumer.Runner. An interface, so that
// the test kit imports nothing of idemq and stays on the bottom floor.
type Runner interface {
	Run(ctx context.Context) error
}

// RunUntil runs the runners until done reports true (polled every 10 ms),
// then stops them and waits for Run to return. It fails t if done never
// holds within Timeout or a Run returns an error.
func RunUntil[R Runner](t testing.TB, done func() bool, runners ...R) {
	t.Helper()
	RunUntilUnless(t, done, nil, runners...)
}

// RunUntilUnless is RunUntil that also polls wrong (nil: none) and, as soon
// as it returns a description, stops the runners and fails t with it. A test
// that can observe the failure it guards against (a handler run once too
// often, a dead letter, an ack) reports it when it happens instead of
// after Timeout.
func RunUntilUnless[R Runner](t testing.TB, done func() bool, wrong func() string, runners ...R) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make([]error, len(runners))
	for i, r := range runners {
		wg.Go(func() { errs[i] = r.Run(ctx) })
	}
	deadline := time.Now().Add(Timeout)
	ok, bad := false, ""
	for !ok && bad == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		if wrong != nil {
			bad = wrong()
		}
		ok = bad == "" && done()
	}
	cancel()
	wg.Wait()
	if bad != "" {
		t.Fatal(bad)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !ok {
		t.Fatalf("condition not reached within %v", Timeout)
	}
}

// AtMost returns a wrong for RunUntilUnless that reports count() above n,
// named what ("handler calls").
func AtMost(what string, n int, count func() int) func() string {
	return func() string {
		if c := count(); c > n {
			return fmt.Sprintf("%s: %d, want at most %d", what, c, n)
		}
		return ""
	}
}
