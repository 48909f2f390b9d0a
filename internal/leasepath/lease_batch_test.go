package leasepath_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sinks/webhook/webhooktest"
)

// refreshOutage is a Redis lease store whose refreshes fail (not with
// ErrLeaseLost: the store is unreachable for them), except those of key
// healthy, and which records the sizes of its batch claims.
type refreshOutage struct {
	dedupdriver.Lease
	healthy    string
	batchSizes chan int
	afterBatch func() // called once the first batch claim returned
}

func (s *refreshOutage) Driver() dedupdriver.Lease { return s }

func (s *refreshOutage) Refresh(ctx context.Context, scope, key, token string, lease time.Duration) error {
	if key == s.healthy {
		return s.Lease.Refresh(ctx, scope, key, token, lease)
	}
	return errors.New("refresh: connection reset by peer")
}

func (s *refreshOutage) ClaimBatch(ctx context.Context, scope string, recs []dedup.Record, tokens []string, lease time.Duration) ([]dedup.Claim, error) {
	cs, err := s.Lease.ClaimBatch(ctx, scope, recs, tokens, lease)
	select {
	case s.batchSizes <- len(recs):
		s.afterBatch()
	default:
	}
	return cs, err
}

// A message queued behind a slow one in a batch must not run under a lease
// that expired while it waited. Worker A claims k1 and k2 in one batch (lease
// 300 ms, refresh every 100 ms), the refreshes of k2's lease fail, and k1's
// handler runs until worker B has claimed the expired k2 and applied it (k1's
// own refreshes succeed: a handler whose refreshes fail is cancelled before
// its lease expires, see TestLeaseRunningHandlerCancelledWhenRefreshesStall).
// When A reaches k2 it must find that out instead of applying k2 a second
// time.
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
	storeA := &refreshOutage{Lease: redisA.Driver(), healthy: "k1", batchSizes: make(chan int, 1)}
	send := env.sink.Handler()
	k2Done := func() bool { return env.rcv.Successes(env.key("k2")) > 0 }
	var grouped atomic.Bool // A claimed k1 and k2 in one batch: the scenario
	slowK1 := func(ctx context.Context, m *consumer.Message) error {
		if m.Key == "k1" && grouped.Load() {
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
	storeA.afterBatch = func() {
		grouped.Store(true)
		env.publishTo(other, "k2", `{"n":2}`, 1)
	}

	// Without a batch claim nothing reaches B: k1's success is enough.
	runtest.RunUntil(t, func() bool {
		return env.rcv.Successes(env.key("k1")) > 0 && (!grouped.Load() || env.settled(other))
	}, a, b)
	select {
	case n := <-storeA.batchSizes:
		batched = n == 2
	default:
	}
	return batched, env.rcv.Successes(env.key("k2"))
}

// refreshInFlight is a Redis lease store whose first refresh of a queued
// lease of key k2 finds the lease gone (the key is deleted, as if it had
// expired while the process stalled) and stays in flight until k2's handler
// starts or a second passes.
type refreshInFlight struct {
	dedupdriver.Lease
	rkey       func(key string) string
	del        func(ctx context.Context, rkey string) error
	once       sync.Once
	inFlight   chan struct{} // closed when the refresh of k2 is under way
	k2Started  chan struct{} // closed when a handler of k2 starts
	lostToken  chan string   // the token whose lease the refresh found gone
	batchSizes chan int
}

func (s *refreshInFlight) Driver() dedupdriver.Lease { return s }

func (s *refreshInFlight) ClaimBatch(ctx context.Context, scope string, recs []dedup.Record, tokens []string, lease time.Duration) ([]dedup.Claim, error) {
	select {
	case s.batchSizes <- len(recs):
	default:
	}
	return s.Lease.ClaimBatch(ctx, scope, recs, tokens, lease)
}

func (s *refreshInFlight) Refresh(ctx context.Context, scope, key, token string, lease time.Duration) error {
	if _, running := consumer.LeaseToken(ctx); key != "k2" || running {
		return s.Lease.Refresh(ctx, scope, key, token, lease)
	}
	first := false
	s.once.Do(func() { first = true })
	if !first {
		return s.Lease.Refresh(ctx, scope, key, token, lease)
	}
	if err := s.del(ctx, s.rkey(key)); err != nil {
		return err
	}
	s.lostToken <- token
	close(s.inFlight)
	select {
	case <-s.k2Started:
	case <-time.After(time.Second):
	}
	return s.Lease.Refresh(ctx, scope, key, token, lease) // ErrLeaseLost
}

// A queued message is handed to its handler while a refresh of its lease is
// still in flight; that refresh then reports the lease lost. The handler must
// not run under that lease: the runner waits for the refresh before it uses
// the message's claim. (Under load, TestLeaseBatchedClaims caught handlers
// started after their queued lease had been reported lost this way.)
func TestLeaseQueuedRefreshInFlightWhenHandedOut(t *testing.T) {
	for attempt := 1; ; attempt++ {
		batched, ranUnderLost := refreshInFlightWhenHandedOut(t)
		if !batched {
			if attempt == 5 {
				t.Fatal("k1 and k2 never landed in one batch")
			}
			continue
		}
		if ranUnderLost {
			t.Fatal("k2's handler ran under the lease its in-flight refresh found lost")
		}
		return
	}
}

func refreshInFlightWhenHandedOut(t *testing.T) (batched, ranUnderLost bool) {
	env := newLeaseEnv(t, memsource.Config{}, nil)
	env.batch = 2
	opts := consumer.LeaseOptions{Lease: 2 * time.Second, RefreshInterval: 100 * time.Millisecond, InProgressDelay: 50 * time.Millisecond}
	redisA, rdb := newRedisStore(t)
	store := &refreshInFlight{
		Lease:      redisA.Driver(),
		rkey:       func(key string) string { return redisA.RedisKey(env.name, key) },
		del:        func(ctx context.Context, rkey string) error { return rdb.Del(ctx, rkey).Err() },
		inFlight:   make(chan struct{}),
		k2Started:  make(chan struct{}),
		lostToken:  make(chan string, 1),
		batchSizes: make(chan int, 1),
	}
	send := env.sink.Handler()
	var k2Once sync.Once
	var mu sync.Mutex
	h := func(ctx context.Context, m *consumer.Message) error {
		switch m.Key {
		case "k1":
			// Run until the queued refresh of k2 is in flight.
			select {
			case <-store.inFlight:
			case <-time.After(5 * time.Second):
			}
		case "k2":
			token, _ := consumer.LeaseToken(ctx)
			mu.Lock()
			select {
			case lost := <-store.lostToken:
				ranUnderLost = ranUnderLost || lost == token
				store.lostToken <- lost
			default:
			}
			mu.Unlock()
			k2Once.Do(func() { close(store.k2Started) })
		}
		return send(ctx, m)
	}
	env.publish("k1", `{"n":1}`, 1)
	env.publish("k2", `{"n":2}`, 1)
	a := env.runner(t, store, h, opts, 1)
	runtest.RunUntil(t, func() bool { return env.settled() && env.rcv.Successes(env.key("k2")) > 0 }, a)
	select {
	case n := <-store.batchSizes:
		batched = n == 2
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	return batched, ranUnderLost
}
