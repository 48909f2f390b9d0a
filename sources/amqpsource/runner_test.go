package amqpsource_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// The runner over a real queue applies every message once, including the
// producer's duplicates (same key sent twice).
func TestRunnerExactlyOnce(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	db := newDatabase(t)
	q := newQueue(t, url, quorum, 0)
	out := outgoing("once", 200)
	publish(t, url, q, out...)
	publish(t, url, q, out[:20]...) // the producer retried these

	rc := consumer.Config{Name: "once", Concurrency: 4, BatchSize: 10}
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: amqpsource.PrefetchFor(rc)})
	r, err := consumer.NewRunner(src, consumer.Transactional(db.store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return apply(ctx, tx, m.Key)
	}), rc)
	if err != nil {
		t.Fatal(err)
	}
	stop := runtest.Start(t, r)
	runtest.WaitFor(t, testTimeout, runtest.Say("220 messages settled"), func() bool {
		s := r.Stats()
		return s.Handled+s.Duplicates == 220
	})
	stop()
	db.requireExactlyOnce(t, keysOf(out))
	if s := r.Stats(); s.Handled != 200 || s.Duplicates != 20 || s.AckFailures != 0 {
		t.Errorf("stats %+v, want 200 handled, 20 duplicates, no ack failures", s)
	}
	if d := queueDepth(t, url, q); d != 0 {
		t.Errorf("%d messages left in the queue", d)
	}
}

// dropAcks is a source whose acknowledgements never reach the broker, as if
// the process died between the commit and the ack.
type dropAcks struct{ consumer.Source }

func (dropAcks) Ack(context.Context, []*consumer.Message) error { return nil }

// A crash after the commit and before the ack: the redeliveries are
// acknowledged without running the handler again.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	db := newDatabase(t)
	q := newQueue(t, url, quorum, 0)
	out := outgoing("crash", 50)
	publish(t, url, q, out...)

	var calls atomic.Int64
	path := consumer.Transactional(db.store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		calls.Add(1)
		return apply(ctx, tx, m.Key)
	})
	rc := consumer.Config{Name: "crash", Concurrency: 2, BatchSize: 5}

	// Unacknowledged deliveries count against the prefetch: let all in.
	first := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 100})
	r1, err := consumer.NewRunner(dropAcks{first}, path, rc)
	if err != nil {
		t.Fatal(err)
	}
	stop := runtest.Start(t, r1)
	runtest.WaitFor(t, testTimeout, runtest.Say("50 effects committed"), func() bool { return len(db.effects(t)) == 50 })
	stop()
	_ = first.Close() // the "crash": every delivery goes back to the queue
	if c := calls.Load(); c != 50 {
		t.Fatalf("handler ran %d times before the crash, want 50", c)
	}

	second := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: amqpsource.PrefetchFor(rc)})
	r2, err := consumer.NewRunner(second, path, rc)
	if err != nil {
		t.Fatal(err)
	}
	stop = runtest.Start(t, r2)
	runtest.WaitFor(t, testTimeout, runtest.Say("50 redeliveries acknowledged"), func() bool { return r2.Stats().Duplicates == 50 })
	stop()
	if c := calls.Load(); c != 50 {
		t.Errorf("handler ran %d times in all, want 50: a redelivery re-ran it", c)
	}
	if s := r2.Stats(); s.Handled != 0 {
		t.Errorf("second runner handled %d messages, want 0", s.Handled)
	}
	db.requireExactlyOnce(t, keysOf(out))
	if d := queueDepth(t, url, q); d != 0 {
		t.Errorf("%d messages left in the queue", d)
	}
}

// A failing handler is retried through the delay queues until it succeeds,
// with Attempt growing, and its effect is applied once.
func TestRetryWithDelayThenSuccess(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	db := newDatabase(t)
	q := newQueue(t, url, classic, 0)
	out := outgoing("retry", 5)
	publish(t, url, q, out...)

	var mu sync.Mutex
	attempts := map[string][]int{}
	rc := consumer.Config{
		Name: "retry", Concurrency: 2, BatchSize: 1,
		Retry: consumer.RetryPolicy{MaxAttempts: 5, InitialBackoff: 150 * time.Millisecond, Jitter: -1},
	}
	src := newSource(t, amqpsource.Config{URL: url, Queue: q})
	r, err := consumer.NewRunner(src, consumer.Transactional(db.store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		attempts[m.Key] = append(attempts[m.Key], m.Attempt)
		mu.Unlock()
		if err := apply(ctx, tx, m.Key); err != nil {
			return err
		}
		if m.Attempt < 3 {
			return fmt.Errorf("transient failure on attempt %d", m.Attempt)
		}
		return nil
	}), rc)
	if err != nil {
		t.Fatal(err)
	}
	stop := runtest.Start(t, r)
	// Two retries of 150 and 300 ms each: a message whose retry copy never
	// comes back fails the test in seconds.
	runtest.WaitFor(t, 2*backTimeout, runtest.Say("5 messages handled"), func() bool { return r.Stats().Handled == 5 })
	stop()

	db.requireExactlyOnce(t, keysOf(out)) // the failed attempts' writes were rolled back
	mu.Lock()
	defer mu.Unlock()
	for _, k := range keysOf(out) {
		if got := fmt.Sprint(attempts[k]); got != "[1 2 3]" {
			t.Errorf("key %s ran on attempts %s, want [1 2 3]", k, got)
		}
	}
	if s := r.Stats(); s.Retried != 10 || s.DeadLettered != 0 {
		t.Errorf("stats %+v, want 10 retries and no dead letters", s)
	}
	// Backoff 150 ms then 300 ms: the retry queues of those delays were used.
	for _, d := range []time.Duration{150 * time.Millisecond, 300 * time.Millisecond} {
		name := amqpsource.RetryQueueName(q+".retry.", d)
		if n := queueDepth(t, url, name); n != 0 {
			t.Errorf("retry queue %s holds %d messages, want 0", name, n)
		}
	}
}

// Poison goes to the dead-letter queue with its reason: a permanent handler
// error, a message without a key, and a message whose retries ran out.
func TestPoisonIsDeadLettered(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	db := newDatabase(t)
	q := newQueue(t, url, quorum, 0)
	good := outgoing("good", 10)
	publish(t, url, q, good...)
	publish(t, url, q,
		sourcetest.Outgoing{Key: "poison", Body: []byte(`{"account":42}`)},
		sourcetest.Outgoing{Body: []byte(`{"no":"key"}`)},
		sourcetest.Outgoing{Key: "flaky", Body: []byte(`{}`)},
	)

	src := newSource(t, amqpsource.Config{URL: url, Queue: q})
	rc := consumer.Config{
		Name: "poison", Concurrency: 2, BatchSize: 4, KeyFunc: consumer.RequireKey,
		Retry: consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: 50 * time.Millisecond, Jitter: -1},
	}
	r, err := consumer.NewRunner(src, consumer.Transactional(db.store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch m.Key {
		case "poison":
			return consumer.Permanent(errors.New("unknown account 42"))
		case "flaky":
			return errors.New("downstream unavailable")
		}
		return apply(ctx, tx, m.Key)
	}), rc)
	if err != nil {
		t.Fatal(err)
	}
	stop := runtest.Start(t, r)
	runtest.WaitFor(t, testTimeout, runtest.Say("3 dead letters"), func() bool { return len(peek(t, url, q+".dlq")) == 3 })
	runtest.WaitFor(t, testTimeout, runtest.Say("10 messages handled"), func() bool { return r.Stats().Handled == 10 })
	stop()

	db.requireExactlyOnce(t, keysOf(good))
	reasons := map[string]string{}
	for _, d := range peek(t, url, q+".dlq") {
		key, _ := d.Headers[consumer.MetaKey].(string)
		reason, _ := d.Headers[consumer.MetaReason].(string)
		if d.Headers[amqpsource.MetaOriginQueue] != q {
			t.Errorf("dead letter %q: %s = %v, want %s", key, amqpsource.MetaOriginQueue, d.Headers[amqpsource.MetaOriginQueue], q)
		}
		if key == "flaky" && d.Headers[consumer.MetaAttempts] != int64(3) {
			t.Errorf("dead letter flaky: %s = %v, want 3", consumer.MetaAttempts, d.Headers[consumer.MetaAttempts])
		}
		reasons[key] = reason
	}
	for key, want := range map[string]string{
		"poison": "unknown account 42",
		"":       "neither",
		"flaky":  "retries exhausted",
	} {
		if !strings.Contains(reasons[key], want) {
			t.Errorf("dead letter %q: reason %q, want it to mention %q", key, reasons[key], want)
		}
	}
	if d := queueDepth(t, url, q); d != 0 {
		t.Errorf("%d messages left in the queue", d)
	}
}

// A forced connection close in the middle of the stream (a network failure),
// while batches are inside their transactions: the source reconnects, the
// acknowledgements of the dead channel are not sent, the redeliveries are
// recognised, nothing is lost and nothing applied twice.
func TestReconnectMidStream(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	db := newDatabase(t)
	q := newQueue(t, url, quorum, 0)
	out := outgoing("reconnect", 300)
	publish(t, url, q, out...)

	rc := consumer.Config{Name: "reconnect", Concurrency: 4, BatchSize: 10}
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: amqpsource.PrefetchFor(rc), ReconnectDelay: 20 * time.Millisecond})
	// After 100 handler calls, handlers wait inside their transactions
	// until the connection has been cut.
	var calls atomic.Int64
	gate := make(chan struct{})
	r, err := consumer.NewRunner(src, consumer.Transactional(db.store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if calls.Add(1) > 100 {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return apply(ctx, tx, m.Key)
	}), rc)
	if err != nil {
		t.Fatal(err)
	}
	stop := runtest.Start(t, r)
	runtest.WaitFor(t, testTimeout, runtest.Say("handlers waiting mid-batch"), func() bool { return calls.Load() >= 104 })
	if n := forceCloseConnections(t, q); n != 1 {
		t.Fatalf("closed %d connections, want 1", n)
	}
	runtest.WaitFor(t, testTimeout, runtest.Say("the reconnect"), func() bool { return src.Stats().Reconnects == 1 })
	close(gate)
	runtest.WaitFor(t, testTimeout, runtest.Say("300 effects"), func() bool { return len(db.effects(t)) == 300 })
	runtest.WaitFor(t, testTimeout, runtest.Say("an empty queue"), func() bool { return queueDepth(t, url, q) == 0 })
	stop()
	db.requireExactlyOnce(t, keysOf(out))
	rs, ss := r.Stats(), src.Stats()
	t.Logf("runner %+v; source %+v", rs, ss)
	if ss.StaleSettles == 0 || rs.Duplicates == 0 {
		t.Errorf("the batches cut mid-transaction left no stale acknowledgement (%d) or no recognised redelivery (%d)", ss.StaleSettles, rs.Duplicates)
	}
}
