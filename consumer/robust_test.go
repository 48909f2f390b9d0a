package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/consumertest"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
)

// until polls cond until it holds, failing the test after 30 s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (e *memEnv) settled() memsource.TopicStats {
	e.t.Helper()
	var st memsource.TopicStats
	until(e.t, "every message settled", func() bool {
		st = e.broker.Stats(e.topic)
		return st.Ready == 0 && st.InFlight == 0 && st.Pending == 0
	})
	return st
}

// Keys with CR, LF or any other control character could be written into a
// downstream header: they are dead-lettered at once with ErrInvalidKey and
// the handler never runs.
func TestControlCharacterKeysAreDeadLettered(t *testing.T) {
	store := memStore(t)
	bad := []string{"crlf\r\nX-Injected: 1", "line\nfeed", "tab\tkey", "del\x7f", "c1\u0085next", "esc\x1b[0m"}
	var script []consumertest.Delivery
	for _, k := range append(bad, "good") {
		script = append(script, consumertest.Delivery{Key: k, Body: []byte("x")})
	}
	rep := consumertest.ReplayTx(t, store, func(_ context.Context, tx *memdedup.Tx, msg *consumer.Message) error {
		return tx.Add("effects/"+msg.Key, 1)
	}, script, consumertest.Options{})
	if rep.Deliveries != uint64(len(script)) {
		t.Fatalf("%d deliveries, want %d (no retries)", rep.Deliveries, len(script))
	}
	if len(rep.DeadLetters) != len(bad) {
		t.Fatalf("%d dead letters, want %d: %+v", len(rep.DeadLetters), len(bad), rep.DeadLetters)
	}
	for _, d := range rep.DeadLetters {
		if !errors.Is(d.Err, consumer.ErrInvalidKey) {
			t.Errorf("dead letter %q: %v, want ErrInvalidKey", d.Key, d.Err)
		}
		if rep.Calls[d.Key] != 0 {
			t.Errorf("handler ran for invalid key %q", d.Key)
		}
	}
	if rep.Calls["good"] != 1 || rep.Committed["good"] != 1 || store.Value("effects/good") != 1 {
		t.Fatalf("good: %d calls, %d effects, want 1 and 1", rep.Calls["good"], store.Value("effects/good"))
	}
}

// A KeyFunc that panics on one malformed message must not crash the process
// (the receive loop calls it to pick a lane): the message is dead-lettered
// with the panic as the reason and the others are handled.
func TestKeyFuncPanicIsDeadLettered(t *testing.T) {
	for _, conc := range []int{1, 4} {
		t.Run(map[int]string{1: "one lane", 4: "four lanes"}[conc], func(t *testing.T) {
			e := newMemEnv(t, time.Second)
			e.broker.Publish(e.topic,
				memsource.Outgoing{Key: "a", Body: []byte(`{}`)},
				memsource.Outgoing{Key: "boom", Body: []byte(`{}`)},
				memsource.Outgoing{Key: "b", Body: []byte(`{}`)})
			keyFunc := func(m *consumer.Message) (string, error) {
				if m.Key == "boom" {
					var headers map[string]string
					headers["x"] = "assignment to entry in nil map" //nolint:staticcheck // SA5000: the runtime panic is the test
				}
				return m.Key, nil
			}
			_, stop := e.run(e.broker.Source(e.topic), e.handler(nil), consumer.Config{Concurrency: conc, KeyFunc: keyFunc})
			e.settled()
			stop()
			dl := e.broker.DeadLetters(e.topic)
			if len(dl) != 1 || dl[0].Key != "boom" {
				t.Fatalf("dead letters %+v, want only boom", dl)
			}
			var pe *consumer.PanicError
			if !errors.Is(dl[0].Err, consumer.ErrMissingKey) || !errors.As(dl[0].Err, &pe) ||
				!strings.Contains(dl[0].Reason, "nil map") {
				t.Fatalf("dead-letter reason %v: want ErrMissingKey wrapping the *PanicError", dl[0].Err)
			}
			if e.called("a") != 1 || e.called("b") != 1 || e.called("boom") != 0 {
				t.Fatalf("calls a=%d b=%d boom=%d, want 1, 1, 0", e.called("a"), e.called("b"), e.called("boom"))
			}
		})
	}
}

// keyErrSource marks every message with key "bad" as one whose key the
// source could not read.
type keyErrSource struct{ consumer.Source }

func (s keyErrSource) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	ms, err := s.Source.Receive(ctx, max)
	for _, m := range ms {
		if m.Key == "bad" {
			d := consumer.DeliveryOf(m)
			d.KeyErr = errors.New("key header is not text")
			consumer.Deliver(m, d)
		}
	}
	return ms, err
}

// A key the source could not read is dead-lettered with the source's reason,
// whatever Config.KeyFunc says.
func TestSourceKeyErrorIsDeadLettered(t *testing.T) {
	e := newMemEnv(t, time.Second)
	e.broker.Publish(e.topic, memsource.Outgoing{Key: "bad", Body: []byte("x")}, memsource.Outgoing{Key: "ok", Body: []byte("y")})
	_, stop := e.run(keyErrSource{e.broker.Source(e.topic)}, e.handler(nil), consumer.Config{})
	e.settled()
	stop()
	dl := e.broker.DeadLetters(e.topic)
	if len(dl) != 1 || !errors.Is(dl[0].Err, consumer.ErrMissingKey) || !strings.Contains(dl[0].Reason, "not text") {
		t.Fatalf("dead letters %+v, want bad with ErrMissingKey and the source's reason", dl)
	}
	if e.called("ok") != 1 || e.called("bad") != 0 {
		t.Fatalf("calls ok=%d bad=%d", e.called("ok"), e.called("bad"))
	}
}

// recordingSettler records the runner's Retry and DeadLetter calls and
// performs them whatever the context says, as a source whose dead-letter
// publish does not watch ctx would.
type recordingSettler struct {
	consumer.Source
	retries, deadLetters atomic.Int64
}

func (s *recordingSettler) Retry(ctx context.Context, m *consumer.Message, d time.Duration) error {
	s.retries.Add(1)
	return s.Source.Retry(context.WithoutCancel(ctx), m, d)
}

func (s *recordingSettler) DeadLetter(ctx context.Context, m *consumer.Message, reason error) error {
	s.deadLetters.Add(1)
	return s.Source.DeadLetter(context.WithoutCancel(ctx), m, reason)
}

// A handler cancelled by the drain timeout on its last allowed attempt did
// not fail: the message is neither dead-lettered nor retried, but left to the
// broker, which redelivers it.
func TestShutdownNeverDeadLetters(t *testing.T) {
	e := newMemEnv(t, 200*time.Millisecond)
	e.broker.Publish(e.topic, memsource.Outgoing{Key: "slow", Body: []byte("x")})
	started := make(chan struct{})
	path := e.handler(func(ctx context.Context, msg *consumer.Message) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	src := &recordingSettler{Source: e.broker.Source(e.topic)}
	r, stop := e.run(src, path, consumer.Config{
		Retry:          consumer.RetryPolicy{MaxAttempts: 1},
		DrainTimeout:   50 * time.Millisecond,
		HandlerTimeout: time.Minute,
	})
	<-started
	stop()
	if n := src.deadLetters.Load(); n != 0 {
		t.Fatalf("DeadLetter called %d times for a handler cut short by shutdown", n)
	}
	if n := src.retries.Load(); n != 0 {
		t.Fatalf("Retry called %d times for a handler cut short by shutdown", n)
	}
	if st := r.Stats(); st.DeadLettered != 0 || st.Retried != 0 {
		t.Fatalf("stats %+v: want nothing dead-lettered or retried", st)
	}
	// The broker redelivers it to the next worker.
	_, stop2 := e.run(e.broker.Source(e.topic), e.handler(nil), consumer.Config{Retry: consumer.RetryPolicy{MaxAttempts: 1}})
	e.settled()
	stop2()
	if dl := e.broker.DeadLetters(e.topic); len(dl) != 0 || e.store.Value("effects/slow") != 1 {
		t.Fatalf("after restart: dead letters %+v, effects %d; want none and 1", dl, e.store.Value("effects/slow"))
	}
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Stats.DeadLettered and the "message dead-lettered" line report dead letters
// the source accepted; a failed one is logged and counted as a settle
// failure, and the message comes back.
func TestDeadLetteredCountsOnlyAcceptedDeadLetters(t *testing.T) {
	e := newMemEnv(t, 100*time.Millisecond)
	e.broker.Inject(memsource.Fault{Kind: memsource.DeadLetterError, Times: 1})
	e.broker.Publish(e.topic, memsource.Outgoing{Key: "poison", Body: []byte("x")})
	var logs logBuffer
	path := e.handler(func(context.Context, *consumer.Message) error {
		return consumer.Permanent(errors.New("unknown account"))
	})
	r, stop := e.run(e.broker.Source(e.topic), path, consumer.Config{Logger: logs.logger()})
	until(t, "the second dead letter", func() bool { return len(e.broker.DeadLetters(e.topic)) == 1 })
	until(t, "the stats", func() bool { return r.Stats().DeadLettered >= 1 })
	stop()
	st := r.Stats()
	if st.DeadLettered != 1 || st.SettleFailures != 1 {
		t.Fatalf("stats %+v: want DeadLettered 1 (the accepted one) and SettleFailures 1", st)
	}
	out := logs.String()
	if n := strings.Count(out, `msg="message dead-lettered"`); n != 1 {
		t.Errorf("%d \"message dead-lettered\" lines, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, `msg="dead-letter failed`); n != 1 {
		t.Errorf("%d \"dead-letter failed\" lines, want 1:\n%s", n, out)
	}
}

// The default KeyFunc falls back to the broker's id (which catches
// redeliveries only); RequireKey dead-letters a message without a key of its
// own at once.
func TestRequireKey(t *testing.T) {
	for name, tc := range map[string]struct {
		keyFunc func(*consumer.Message) (string, error)
		dead    int
	}{
		"default falls back to the id": {nil, 0},
		"RequireKey":                   {consumer.RequireKey, 1},
	} {
		t.Run(name, func(t *testing.T) {
			e := newMemEnv(t, time.Second)
			e.broker.Publish(e.topic, memsource.Outgoing{Key: "k", Body: []byte("x")}, memsource.Outgoing{Body: []byte("keyless")})
			_, stop := e.run(e.broker.Source(e.topic), e.handler(nil), consumer.Config{KeyFunc: tc.keyFunc})
			e.settled()
			stop()
			dl := e.broker.DeadLetters(e.topic)
			if len(dl) != tc.dead {
				t.Fatalf("%d dead letters, want %d: %+v", len(dl), tc.dead, dl)
			}
			if tc.dead == 1 && (!errors.Is(dl[0].Err, consumer.ErrMissingKey) || string(dl[0].Body) != "keyless") {
				t.Fatalf("dead letter %+v, want the keyless message with ErrMissingKey", dl[0])
			}
			if e.called("k") != 1 || e.called("") != 1-tc.dead {
				t.Fatalf("calls k=%d keyless=%d", e.called("k"), e.called(""))
			}
		})
	}
	if _, err := consumer.RequireKey(&consumer.Message{}); !errors.Is(err, consumer.ErrMissingKey) || !consumer.IsPermanent(err) {
		t.Fatalf("RequireKey without key or id = %v, want a permanent ErrMissingKey", err)
	}
}
