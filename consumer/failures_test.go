package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// crashedBefore is a source whose every delivery looks as if extra earlier
// deliveries had gone to consumers that crashed or were killed: its Attempt
// (a broker's receive or delivery count) is extra higher. It records the
// delay of every Retry.
type crashedBefore struct {
	consumer.Source
	extra int

	mu     sync.Mutex
	delays []time.Duration
}

func (c *crashedBefore) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	msgs, err := c.Source.Receive(ctx, max)
	for _, m := range msgs {
		m.Attempt += c.extra
	}
	return msgs, err
}

func (c *crashedBefore) Retry(ctx context.Context, msg *consumer.Message, delay time.Duration) error {
	c.mu.Lock()
	c.delays = append(c.delays, delay)
	c.mu.Unlock()
	return c.Source.Retry(ctx, msg, delay)
}

func (c *crashedBefore) retryDelays() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.delays...)
}

// attemptsEnv runs one message through a runner over memsource and memdedup.
type attemptsEnv struct {
	broker *memsource.Broker
	store  *memdedup.Store
	src    *crashedBefore
	log    bytes.Buffer
	logMu  sync.Mutex

	mu    sync.Mutex
	calls int
}

func newAttemptsEnv(t *testing.T, extra int) *attemptsEnv {
	t.Helper()
	store := memStore(t)
	e := &attemptsEnv{broker: memsource.New(memsource.Config{VisibilityTimeout: 200 * time.Millisecond}), store: store}
	t.Cleanup(func() { e.broker.Close() })
	e.src = &crashedBefore{Source: e.broker.Source("t"), extra: extra}
	e.broker.Publish("t", memsource.Outgoing{Key: "k1", Body: []byte("b")})
	return e
}

func (e *attemptsEnv) Write(p []byte) (int, error) {
	e.logMu.Lock()
	defer e.logMu.Unlock()
	return e.log.Write(p)
}

func (e *attemptsEnv) logs() string {
	e.logMu.Lock()
	defer e.logMu.Unlock()
	return e.log.String()
}

// handler fails its first failures calls, then succeeds.
func (e *attemptsEnv) handler(failures int) func(context.Context, *consumer.Message) error {
	return func(context.Context, *consumer.Message) error {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.calls++
		if e.calls <= failures {
			return errors.New("downstream refused")
		}
		return nil
	}
}

func (e *attemptsEnv) handlerCalls() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

func (e *attemptsEnv) config(maxAttempts int) consumer.Config {
	return consumer.Config{
		Name:        "attempts",
		Concurrency: 1,
		Retry:       consumer.RetryPolicy{MaxAttempts: maxAttempts, InitialBackoff: time.Millisecond, MaxBackoff: time.Second, Jitter: -1},
		Logger:      slog.New(slog.NewTextHandler(e, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// settled reports whether the message was acknowledged or dead-lettered.
func (e *attemptsEnv) settled() bool {
	st := e.broker.Stats("t")
	return st.Acks+st.DeadLettered > 0
}

// A message whose broker attempt count was raised by ten crashed consumers
// and whose handler then fails once is retried, not dead-lettered: the retry
// policy counts handler failures. The backoff grows with the failures too.
func TestAttemptsCountHandlerFailuresNotDeliveries(t *testing.T) {
	for name, leased := range map[string]bool{"transactional": false, "leased": true} {
		t.Run(name, func(t *testing.T) {
			e := newAttemptsEnv(t, 10)
			var path consumer.Path
			if leased {
				path = consumer.Leased(e.store.Leases(), e.handler(1), consumer.LeaseOptions{})
			} else {
				h := e.handler(1)
				path = consumer.Transactional(e.store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error { return h(ctx, m) })
			}
			r := newRunner(t, e.src, path, e.config(5))
			runtest.RunUntil(t, e.settled, r)
			st := e.broker.Stats("t")
			if st.DeadLettered != 0 || st.Acks != 1 {
				t.Fatalf("dead-lettered %d, acked %d; want 0 and 1 (dead letters: %+v)", st.DeadLettered, st.Acks, e.broker.DeadLetters("t"))
			}
			if got := e.handlerCalls(); got != 2 {
				t.Fatalf("handler ran %d times, want 2", got)
			}
			if got := e.store.Failures("attempts", "k1"); got != 1 {
				t.Fatalf("failures recorded: %d, want 1", got)
			}
			// Backoff(1) = InitialBackoff, not Backoff(11) = MaxBackoff.
			if d := e.src.retryDelays(); len(d) != 1 || d[0] != time.Millisecond {
				t.Fatalf("retry delays %v, want [1ms]", d)
			}
		})
	}
}

// MaxAttempts failures dead-letter the message, and the dead-letter reason
// carries the failure count, whatever the broker's count.
func TestMaxAttemptsCountsHandlerFailures(t *testing.T) {
	e := newAttemptsEnv(t, 10)
	h := e.handler(1 << 30)
	path := consumer.Transactional(e.store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error { return h(ctx, m) })
	r := newRunner(t, e.src, path, e.config(3))
	runtest.RunUntilUnless(t, e.settled, runtest.AtMost("handler calls before the dead letter", 3, e.handlerCalls), r)
	if got := e.handlerCalls(); got != 3 {
		t.Fatalf("handler ran %d times before the dead letter, want 3", got)
	}
	dls := e.broker.DeadLetters("t")
	var dle *consumer.DeadLetterError
	if len(dls) != 1 || !errors.As(dls[0].Err, &dle) || dle.Attempts != 3 || !errors.Is(dle, consumer.ErrMaxAttempts) {
		t.Fatalf("dead letters %+v, want one for ErrMaxAttempts after 3 attempts", dls)
	}
	// The delays grew with the failures: Backoff(1), Backoff(2).
	if d := e.src.retryDelays(); len(d) != 2 || d[0] != time.Millisecond || d[1] != 2*time.Millisecond {
		t.Fatalf("retry delays %v, want [1ms 2ms]", d)
	}
	// The dead letter forgot the count: a replay starts afresh.
	if got := e.store.Failures("attempts", "k1"); got != 0 {
		t.Fatalf("failure count after the dead letter: %d, want 0", got)
	}
}

// A dead letter that fails keeps the count: the redelivery's next failure
// tries the dead letter again instead of starting over.
func TestFailedDeadLetterKeepsTheCount(t *testing.T) {
	e := newAttemptsEnv(t, 0)
	e.broker.Inject(memsource.Fault{Kind: memsource.DeadLetterError})
	h := e.handler(1 << 30)
	path := consumer.Transactional(e.store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error { return h(ctx, m) })
	r := newRunner(t, e.src, path, e.config(2))
	runtest.RunUntilUnless(t, e.settled, runtest.AtMost("handler calls", 3, e.handlerCalls), r)
	if got := e.handlerCalls(); got != 3 {
		t.Fatalf("handler ran %d times, want 3 (2 failures, a failed dead letter, 1 more failure)", got)
	}
	dls := e.broker.DeadLetters("t")
	var dle *consumer.DeadLetterError
	if len(dls) != 1 || !errors.As(dls[0].Err, &dle) || dle.Attempts != 3 {
		t.Fatalf("dead letters %+v, want one after 3 attempts", dls)
	}
}

// The same key with another payload (a producer's corrected message) does
// not inherit the failures of the first.
func TestAnotherPayloadStartsTheCountAgain(t *testing.T) {
	e := newAttemptsEnv(t, 0)
	ctx := context.Background()
	for range 4 {
		if _, err := e.store.Driver().RecordFailure(ctx, "attempts", dedup.Record{Key: "k1", PayloadHash: dedup.HashPayload([]byte("old"))}); err != nil {
			t.Fatal(err)
		}
	}
	h := e.handler(1)
	path := consumer.Transactional(e.store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error { return h(ctx, m) })
	r := newRunner(t, e.src, path, e.config(2))
	runtest.RunUntil(t, e.settled, r)
	if st := e.broker.Stats("t"); st.Acks != 1 || st.DeadLettered != 0 {
		t.Fatalf("acked %d, dead-lettered %d; want the new payload retried after its own first failure and acked", st.Acks, st.DeadLettered)
	}
}

// In a batch, only the message whose handler failed is counted.
func TestBatchCountsOnlyTheFailedMessage(t *testing.T) {
	e := newAttemptsEnv(t, 0)
	e.broker.Publish("t", memsource.Outgoing{Key: "k2", Body: []byte("b")}, memsource.Outgoing{Key: "k3", Body: []byte("b")})
	var mu sync.Mutex
	failed := false
	path := consumer.Transactional(e.store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.Key == "k2" && !failed {
			failed = true
			return errors.New("downstream refused")
		}
		return nil
	})
	cfg := e.config(5)
	cfg.BatchSize = 3
	r := newRunner(t, e.src, path, cfg)
	runtest.RunUntil(t, func() bool { return e.broker.Stats("t").Acks == 3 }, r)
	for key, want := range map[string]int{"k1": 0, "k2": 1, "k3": 0} {
		if got := e.store.Failures("attempts", key); got != want {
			t.Errorf("failures of %s: %d, want %d", key, got, want)
		}
	}
}

// When the store cannot count the failure, the runner falls back to the
// broker's attempt count and says so.
func TestFailureCounterDownFallsBackToBrokerAttempts(t *testing.T) {
	e := newAttemptsEnv(t, 10)
	e.store.Inject(memdedup.Fault{Kind: memdedup.RecordFailureError, Times: -1})
	h := e.handler(1 << 30)
	path := consumer.Transactional(e.store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error { return h(ctx, m) })
	r := newRunner(t, e.src, path, e.config(5))
	runtest.RunUntilUnless(t, e.settled, runtest.AtMost("handler calls (broker attempt 11 >= MaxAttempts 5)", 1, e.handlerCalls), r)
	if got := e.handlerCalls(); got != 1 {
		t.Fatalf("handler ran %d times, want 1 (broker attempt 11 >= MaxAttempts 5)", got)
	}
	dls := e.broker.DeadLetters("t")
	var dle *consumer.DeadLetterError
	if len(dls) != 1 || !errors.As(dls[0].Err, &dle) || dle.Attempts != 11 {
		t.Fatalf("dead letters %+v, want one after 11 attempts", dls)
	}
	if !strings.Contains(e.logs(), "counting the handler failure failed") {
		t.Fatalf("fallback not logged:\n%s", e.logs())
	}
}
