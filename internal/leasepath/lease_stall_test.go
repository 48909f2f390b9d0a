package leasepath_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/webhook/webhooktest"
)

// A running handler never outlives its lease, whatever the refreshes fail
// with. Worker A claims k1 through a proxy to the real Redis (lease 300 ms,
// refresh every 100 ms) and its handler would run for 1 s; the proxy stalls
// as the handler starts, so A's refreshes hang instead of failing with
// ErrLeaseLost. Worker B, on its own connection, gets k1 by another route and
// applies it once A's lease expired. A's handler must be cancelled before
// that (so it applies nothing): k1 is applied exactly once.
func TestLeaseRunningHandlerCancelledWhenRefreshesStall(t *testing.T) {
	redisB, _ := newRedisStore(t) // skips with -short
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, opts.Addr)
	opts.Addr = proxy.Addr()
	rdbA := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdbA.Close() })
	t.Cleanup(proxy.Restore) // before rdbA closes
	redisA, err := redisdedup.New(rdbA, redisdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}

	env := newLeaseEnv(t, memsource.Config{}, func(webhooktest.Call) webhooktest.Response { return webhooktest.Response{} })
	lease := consumer.LeaseOptions{Lease: 300 * time.Millisecond, RefreshInterval: 100 * time.Millisecond, InProgressDelay: 50 * time.Millisecond}
	other := randomName("topic-b")
	send := env.sink.Handler()

	var (
		effects   atomic.Int32 // applications of k1, by A or B
		aStarted  atomic.Bool
		aReturned = make(chan error, 1) // A's first handler's cancellation cause
	)
	handlerA := func(ctx context.Context, m *consumer.Message) error {
		if !aStarted.CompareAndSwap(false, true) {
			effects.Add(1) // a later run of A, if it claims k1 before B
			return send(ctx, m)
		}
		proxy.Stall()
		env.publishTo(other, "k1", `{"n":1}`, 1)
		t0 := time.Now()
		for time.Since(t0) < time.Second && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		if ctx.Err() == nil {
			effects.Add(1) // the effect, applied after B's
			aReturned <- nil
			return nil
		}
		aReturned <- context.Cause(ctx)
		return ctx.Err()
	}
	handlerB := func(ctx context.Context, m *consumer.Message) error {
		effects.Add(1)
		return send(ctx, m)
	}
	env.publish("k1", `{"n":1}`, 1)
	a := env.runner(t, redisA, handlerA, lease, 1)
	b := env.runnerOn(t, other, redisB, handlerB, lease, 1)

	var cause error
	runtest.RunUntil(t, func() bool {
		if cause == nil {
			select {
			case cause = <-aReturned:
				if cause == nil {
					cause = errors.New("not cancelled")
				}
				proxy.Restore() // let A settle k1
			default:
			}
		}
		return effects.Load() > 1 || (cause != nil && env.settled(other))
	}, a, b)
	if n := effects.Load(); n != 1 {
		t.Fatalf("k1 was applied %d times, want exactly 1 (A's handler ended with %v)", n, cause)
	}
	if !errors.Is(cause, dedup.ErrLeaseLost) {
		t.Fatalf("A's handler was cancelled with %v, want a cause matching dedup.ErrLeaseLost", cause)
	}
}
