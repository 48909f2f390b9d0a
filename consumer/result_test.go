package consumer_test

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
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/runtest"
)

// outcomeSource records the Outcome of every message the runner
// acknowledges, as a replying source (sources/httpsource) reads it.
type outcomeSource struct {
	consumer.Source
	mu   sync.Mutex
	seen []seenOutcome
}

type seenOutcome struct {
	key      string
	attempt  int
	result   string
	replayed bool
	ok       bool
}

func (s *outcomeSource) Ack(ctx context.Context, msgs []*consumer.Message) error {
	s.mu.Lock()
	for _, m := range msgs {
		res, replayed, ok := consumer.StoredResult(m)
		s.seen = append(s.seen, seenOutcome{key: m.Key, attempt: m.Attempt, result: string(res), replayed: replayed, ok: ok})
	}
	s.mu.Unlock()
	return s.Source.Ack(ctx, msgs)
}

func (s *outcomeSource) outcomes() []seenOutcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenOutcome(nil), s.seen...)
}

// waitAcked waits until n acknowledgements were seen, failing as soon as the
// fixture's call budget is exceeded or more than maxRetries retries happened.
func (s *outcomeSource) waitAcked(f *fixture, n int, maxRetries uint64) []seenOutcome {
	f.t.Helper()
	f.waitFor(fmt.Sprintf("%d acknowledgements", n), func(st memsource.TopicStats) bool {
		if st.Retries > maxRetries {
			f.t.Fatalf("%d retries, want at most %d (outcomes so far %+v)", st.Retries, maxRetries, s.outcomes())
		}
		return len(s.outcomes()) >= n
	})
	return s.outcomes()
}

// TestOutcome: a handler's result is stored with its record, and a
// redelivery of the key (its ack was lost), a producer's second copy, or a
// second copy in the same batch gets the stored result through
// StoredResult, byte for byte, without running the handler again.
func TestOutcome(t *testing.T) {
	t.Run("tx redelivery replays the stored result", func(t *testing.T) {
		f := newFixture(t)
		f.maxCalls("a", 1)
		f.broker.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Key: "a"})
		src := &outcomeSource{Source: f.broker.Source(f.topic)}
		h := consumer.TxResult(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error) {
			if err := f.handler(nil)(ctx, tx, msg); err != nil {
				return nil, err
			}
			return []byte("charge-of-" + msg.Key + "\x00\xff"), nil
		})
		f.start(src, consumer.Transactional[pgx.Tx](f.store, h), consumer.Config{Concurrency: 1})
		f.publish("a")
		got := src.waitAcked(f, 2, 0)
		want := "charge-of-a\x00\xff"
		if o := got[0]; !o.ok || o.replayed || o.result != want {
			t.Errorf("first delivery: outcome %+v, want fresh %q", o, want)
		}
		if o := got[1]; !o.ok || !o.replayed || o.result != want || o.attempt < 2 {
			t.Errorf("redelivery: outcome %+v, want replayed %q on attempt 2", o, want)
		}
		f.requireOnce("a")
		e, err := f.store.Inspect(context.Background(), "test", "a")
		if err != nil || string(e.Result) != want {
			t.Errorf("Inspect = %q, %v; want result %q", e.Result, err, want)
		}
	})

	t.Run("tx copies in one batch share the result", func(t *testing.T) {
		f := newFixture(t)
		f.maxCalls("b", 1)
		src := &outcomeSource{Source: f.broker.Source(f.topic)}
		f.publish("b", "b", "c")
		h := consumer.TxResult(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error) {
			return []byte("r-" + msg.Key), f.handler(nil)(ctx, tx, msg)
		})
		f.start(src, consumer.Transactional[pgx.Tx](f.store, h), consumer.Config{Concurrency: 1, BatchSize: 3, BatchWait: time.Second})
		got := src.waitAcked(f, 3, 0)
		var fresh, replayed int
		for _, o := range got {
			switch {
			case o.key == "b" && o.ok && o.result == "r-b" && o.replayed:
				replayed++
			case o.ok && o.result == "r-"+o.key && !o.replayed:
				fresh++
			default:
				t.Errorf("unexpected outcome %+v", o)
			}
		}
		if fresh != 2 || replayed != 1 {
			t.Errorf("%d fresh and %d replayed outcomes, want 2 and 1: %+v", fresh, replayed, got)
		}
	})

	t.Run("tx oversize result is dead-lettered and rolled back", func(t *testing.T) {
		f := newFixture(t)
		f.maxCalls("big", 1)
		src := &outcomeSource{Source: f.broker.Source(f.topic)}
		h := consumer.TxResult(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error) {
			return []byte("12345"), f.handler(nil)(ctx, tx, msg)
		})
		f.start(src, consumer.Transactional[pgx.Tx](f.store, h), consumer.Config{Concurrency: 1, MaxResultBytes: 4})
		f.publish("big")
		f.waitFor("a dead letter", func(st memsource.TopicStats) bool { return st.DeadLettered == 1 })
		dl := f.broker.DeadLetters(f.topic)
		if len(dl) != 1 || !errors.Is(dl[0].Err, consumer.ErrResultTooLarge) {
			t.Fatalf("dead letters %+v, want one with ErrResultTooLarge", dl)
		}
		if n := f.effects()["big"]; n != 0 {
			t.Errorf("%d effects committed for an oversize result, want 0", n)
		}
		if _, err := f.store.Inspect(context.Background(), "test", "big"); !errors.Is(err, dedup.ErrNotFound) {
			t.Errorf("Inspect after an oversize result: %v, want ErrNotFound", err)
		}
	})

	t.Run("tx batch handler returns results with SetResult", func(t *testing.T) {
		f := newFixture(t)
		f.maxCalls("a", 2) // the batch runs again without "big"
		f.maxCalls("b", 2)
		f.maxCalls("big", 1)
		f.broker.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Key: "a"})
		src := &outcomeSource{Source: f.broker.Source(f.topic)}
		f.publish("a", "b", "big")
		bh := func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			for _, m := range msgs {
				if err := f.handler(nil)(m.KeyContext(ctx), tx, m); err != nil {
					return err
				}
				if m.Key == "big" {
					m.SetResult([]byte("123456"))
					continue
				}
				m.SetResult([]byte("r-" + m.Key))
			}
			return nil
		}
		f.start(src, consumer.TransactionalBatch[pgx.Tx](f.store, bh),
			consumer.Config{Concurrency: 1, BatchSize: 3, BatchWait: time.Second, MaxResultBytes: 5})
		got := src.waitAcked(f, 3, 0) // a, b, and a's redelivery
		byKey := map[string][]seenOutcome{}
		for _, o := range got {
			byKey[o.key] = append(byKey[o.key], o)
		}
		if o := byKey["b"]; len(o) != 1 || !o[0].ok || o[0].replayed || o[0].result != "r-b" {
			t.Errorf("b: outcomes %+v, want one fresh %q", o, "r-b")
		}
		// a's acknowledgements are dropped: each redelivery replays it.
		if o := byKey["a"]; len(o) < 2 || o[0].result != "r-a" || o[0].replayed {
			t.Errorf("a: outcomes %+v, want fresh %q, then replays", o, "r-a")
		} else {
			for _, r := range o[1:] {
				if !r.ok || !r.replayed || r.result != "r-a" {
					t.Errorf("a: redelivery outcome %+v, want replayed %q", r, "r-a")
				}
			}
		}
		f.waitFor("a dead letter", func(st memsource.TopicStats) bool { return st.DeadLettered == 1 })
		if dl := f.broker.DeadLetters(f.topic); len(dl) != 1 || dl[0].Key != "big" || !errors.Is(dl[0].Err, consumer.ErrResultTooLarge) {
			t.Fatalf("dead letters %+v, want big with ErrResultTooLarge", dl)
		}
		f.requireOnce("a", "b")
		if n := f.effects()["big"]; n != 0 {
			t.Errorf("%d effects committed for an oversize result, want 0", n)
		}
		if e, err := f.store.Inspect(context.Background(), "test", "b"); err != nil || string(e.Result) != "r-b" {
			t.Errorf("Inspect(b) = %q, %v; want result %q", e.Result, err, "r-b")
		}
	})

	t.Run("tx failed handler stores nothing", func(t *testing.T) {
		f := newFixture(t)
		f.maxCalls("f", 2)
		src := &outcomeSource{Source: f.broker.Source(f.topic)}
		h := consumer.TxResult(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error) {
			err := f.handler(func(_ *consumer.Message, call int) error {
				if call == 1 {
					return errors.New("first call fails")
				}
				return nil
			})(ctx, tx, msg)
			return []byte(fmt.Sprintf("call-%d", f.calls(msg.Key))), err
		})
		f.start(src, consumer.Transactional[pgx.Tx](f.store, h), consumer.Config{Concurrency: 1})
		f.publish("f")
		got := src.waitAcked(f, 1, 1)
		if o := got[0]; !o.ok || o.replayed || o.result != "call-2" {
			t.Errorf("outcome %+v, want the second call's fresh result", o)
		}
	})

	t.Run("lease redelivery replays the stored result", func(t *testing.T) {
		mem := memStore(t)
		broker := memBroker(t, memsource.Config{VisibilityTimeout: 300 * time.Millisecond, Seed: 1})
		broker.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Key: "l"})
		src := &outcomeSource{Source: broker.Source("mail")}
		var mu sync.Mutex
		calls := 0
		h := consumer.ResultJSON(func(ctx context.Context, msg *consumer.Message, v map[string]int) (map[string]string, error) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			return map[string]string{"sent": fmt.Sprint(v["n"])}, nil
		})
		r := newRunner(t, src, consumer.Leased(mem.Leases(), h, consumer.LeaseOptions{}), consumer.Config{Name: "test", Concurrency: 1})
		runtest.Start(t, r)
		broker.Publish("mail", memsource.Outgoing{Key: "l", Body: []byte(`{"n":7}`)})
		deadline := time.Now().Add(30 * time.Second)
		for len(src.outcomes()) < 2 {
			mu.Lock()
			c := calls
			mu.Unlock()
			if c > 1 {
				t.Fatalf("handler ran %d times", c)
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out: outcomes %+v", src.outcomes())
			}
			time.Sleep(5 * time.Millisecond)
		}
		got := src.outcomes()
		want := `{"sent":"7"}`
		if o := got[0]; !o.ok || o.replayed || o.result != want {
			t.Errorf("first delivery: outcome %+v, want fresh %q", o, want)
		}
		if o := got[1]; !o.ok || !o.replayed || o.result != want {
			t.Errorf("redelivery: outcome %+v, want replayed %q", o, want)
		}
		if !strings.Contains(want, "7") || calls != 1 {
			t.Errorf("handler ran %d times, want 1", calls)
		}
	})

	t.Run("lease oversize result marks the key done and dead-letters", func(t *testing.T) {
		mem := memStore(t)
		broker := memBroker(t, memsource.Config{VisibilityTimeout: 300 * time.Millisecond, Seed: 1})
		var calls atomic.Int32
		h := consumer.Result(func(ctx context.Context, msg *consumer.Message) ([]byte, error) {
			calls.Add(1)
			return []byte("12345"), nil
		})
		r := newRunner(t, broker.Source("mail"), consumer.Leased(mem.Leases(), h, consumer.LeaseOptions{}),
			consumer.Config{Name: "test", Concurrency: 1, MaxResultBytes: 4})
		runtest.Start(t, r)
		broker.Publish("mail", memsource.Outgoing{Key: "big", Body: []byte("x")})
		deadline := time.Now().Add(30 * time.Second)
		for broker.Stats("mail").DeadLettered == 0 {
			if st := broker.Stats("mail"); st.Acks > 0 || time.Now().After(deadline) {
				t.Fatalf("acknowledged, or no dead letter in time: %+v", st)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if dl := broker.DeadLetters("mail"); len(dl) != 1 || !errors.Is(dl[0].Err, consumer.ErrResultTooLarge) {
			t.Fatalf("dead letters %+v, want one with ErrResultTooLarge", dl)
		}
		e, err := mem.Leases().Inspect(context.Background(), "test", "big")
		if err != nil || e.InProgress || e.Result != nil {
			t.Fatalf("Inspect = %+v, %v; want the key done without a result (its effect happened)", e, err)
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
	})
}
