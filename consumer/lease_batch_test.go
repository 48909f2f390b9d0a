package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/sinks/webhook/webhooktest"
	"github.com/idemq/idemq/sources/memsource"
)

// refreshOutage is a Redis lease store whose refreshes fail (not with
// ErrLeaseLost: the store is unreachable for them) and which records the
// sizes of its batch claims.
type refreshOutage struct {
	*redisdedup.Store
	batchSizes chan int
	afterBatch func() // called once the first batch claim returned
}

func (s *refreshOutage) Refresh(ctx context.Context, scope, key, token string, lease time.Duration) error {
	return errors.New("refresh: connection reset by peer")
}

func (s *refreshOutage) ClaimBatch(ctx context.Context, scope string, recs []dedup.Record, tokens []string, lease time.Duration) ([]dedup.Claim, error) {
	cs, err := s.Store.ClaimBatch(ctx, scope, recs, tokens, lease)
	select {
	case s.batchSizes <- len(recs):
		s.afterBatch()
	default:
	}
	return cs, err
}

// A message queued behind a slow one in a batch must not run under a lease
// that expired while it waited. Worker A claims k1 and k2 in one batch (lease
// 300 ms, refresh every 100 ms), its refreshes fail, and k1's handler runs
// until worker B has claimed the expired k2 and applied it. When A reaches k2
// it must find that out instead of applying k2 a second time.
func TestLeaseQueuedMessageNeverRunsUnderExpiredLease(t *testing.T) {
	for attempt := 1; ; attempt++ {
		batched, k2Effects := leaseExpiredWhileQueued(t)
		if !batched {
			if attempt == 5 {
				t.Fatal("k1 and k2 never landed in one batch")
			}
			continue // the lane took k1 before k2 arrived: not the scenario
		}
		if k2Effects != 1 {
			t.Fatalf("k2 was applied %d times, want exactly 1", k2Effects)
		}
		return
	}
}

// leaseExpiredWhileQueued runs the scenario once and reports whether A
// claimed k1 and k2 in one batch, and how often k2 was applied.
func leaseExpiredWhileQueued(t *testing.T) (batched bool, k2Effects int) {
	env := newLeaseEnv(t, memsource.Config{}, func(webhooktest.Call) webhooktest.Response { return webhooktest.Response{} })
	env.batch = 2
	opts := consumer.LeaseOptions{Lease: 300 * time.Millisecond, RefreshInterval: 100 * time.Millisecond, InProgressDelay: 50 * time.Millisecond}

	redisA, _ := newRedisStore(t)
	storeA := &refreshOutage{Store: redisA, batchSizes: make(chan int, 1)}
	send := env.sink.Handler()
	k2Done := func() bool { return env.rcv.Successes(env.key("k2")) > 0 }
	slowK1 := func(ctx context.Context, m *consumer.Message) error {
		if m.Key == "k1" {
			// Run until B applied k2 (its lease here expired meanwhile),
			// as a handler slower than the lease would.
			deadline := time.Now().Add(20 * time.Second)
			for !k2Done() && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
		}
		return send(ctx, m)
	}
	env.publish("k1", `{"n":1}`, 1)
	env.publish("k2", `{"n":2}`, 1)
	a := env.runner(t, storeA, slowK1, opts, 1)

	// B gets k2 by another route (a redelivery to a second worker), once
	// A holds it.
	other := randomName("topic-b")
	redisB, _ := newRedisStore(t)
	b := env.runnerOn(t, other, redisB, nil, opts, 1)
	storeA.afterBatch = func() { env.publishTo(other, "k2", `{"n":2}`, 1) }

	runUntil(t, func() bool { return env.rcv.Successes(env.key("k1")) > 0 && env.settled(other) }, a, b)
	select {
	case n := <-storeA.batchSizes:
		batched = n == 2
	default:
	}
	return batched, env.rcv.Successes(env.key("k2"))
}
