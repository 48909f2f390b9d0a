// Package runtest holds the helpers idemq's own tests share: running
// Runners, waiting for a condition, a test logger, unique names for topics
// and queues. One helper per check, used by every package.
package runtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
)

// Timeout is how long RunUntil waits for its condition.
const Timeout = 60 * time.Second

// RunUntil runs the runners until done reports true (polled every 10 ms),
// then stops them and waits for Run to return. It fails t if done never
// holds within Timeout or a Run returns an error.
func RunUntil(t testing.TB, done func() bool, runners ...*consumer.Runner) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make([]error, len(runners))
	for i, r := range runners {
		wg.Go(func() { errs[i] = r.Run(ctx) })
	}
	deadline := time.Now().Add(Timeout)
	ok := false
	for !ok && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		ok = done()
	}
	cancel()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !ok {
		t.Fatalf("condition not reached within %v", Timeout)
	}
}
