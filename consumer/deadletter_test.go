package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// runMem runs a Runner over a memsource topic "t" holding msgs, with a
// memdedup store and h, until every message is settled, and returns the
// broker.
func runMem(t *testing.T, cfg consumer.Config, h consumer.TxHandler[*memdedup.Tx], msgs ...memsource.Outgoing) *memsource.Broker {
	t.Helper()
	store := memStore(t)
	b := memBroker(t, memsource.Config{})
	b.Publish("t", msgs...)
	cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = time.Millisecond, 5*time.Millisecond
	runIdle(t, newRunner(t, b.Source("t"), consumer.Transactional(store, h), cfg), 300*time.Millisecond)
	return b
}

// The reason a dead letter carries starts with the handler's error, so that
// a list that shows its first characters shows the cause, and then says
// how many attempts were made.
func TestDeadLetterReasonStartsWithCause(t *testing.T) {
	const cause = "card declined: insufficient funds"
	b := runMem(t, consumer.Config{Retry: consumer.RetryPolicy{MaxAttempts: 2}},
		func(_ context.Context, _ *memdedup.Tx, m *consumer.Message) error {
			if m.Key == "permanent" {
				return consumer.Permanent(errors.New(cause))
			}
			return errors.New(cause)
		},
		memsource.Outgoing{Key: "flaky"}, memsource.Outgoing{Key: "permanent"})
	dls := b.DeadLetters("t")
	if len(dls) != 2 {
		t.Fatalf("dead letters %+v; want 2", dls)
	}
	for _, d := range dls {
		want := cause
		if d.Key == "permanent" {
			want = "permanent: " + cause
		}
		if !strings.HasPrefix(d.Reason, want) {
			t.Errorf("%s: reason %q does not start with %q", d.Key, d.Reason, want)
		}
		if d.Key == "flaky" && (!errors.Is(d.Err, consumer.ErrMaxAttempts) || !strings.Contains(d.Reason, "retries exhausted after 2 attempts")) {
			t.Errorf("%s: reason %q (%v): want ErrMaxAttempts, and the attempts in the text", d.Key, d.Reason, d.Err)
		}
		if d.Key == "permanent" && !strings.Contains(d.Reason, "after 1 attempt)") {
			t.Errorf("%s: reason %q: want the attempt count", d.Key, d.Reason)
		}
	}
}

// A handler's panic is logged with its stack; an oversized message is
// logged with its key, as its dead letter carries it.
func TestPanicAndOversizeLines(t *testing.T) {
	var logs runtest.SyncBuffer
	var calls atomic.Int32
	b := runMem(t, consumer.Config{MaxMessageBytes: 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		func(_ context.Context, _ *memdedup.Tx, m *consumer.Message) error {
			if calls.Add(1) == 1 {
				panicInHandler()
			}
			return nil
		},
		memsource.Outgoing{Key: "panics", Body: []byte("{}")}, memsource.Outgoing{Key: "big-1", Body: []byte("far more than ten bytes")})
	var panicLine, bigLine string
	for _, l := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(l, "key=panics") && strings.Contains(l, "handler panicked"):
			panicLine = l
		case strings.Contains(l, "message dead-lettered") && strings.Contains(l, "too large"):
			bigLine = l
		}
	}
	if !strings.Contains(panicLine, "stack=") || !strings.Contains(panicLine, "panicInHandler") {
		t.Errorf("the panic's line %q lacks its stack; logs:\n%s", panicLine, logs.String())
	}
	if !strings.Contains(bigLine, "key=big-1") {
		t.Errorf("the oversized message's line %q lacks its key; logs:\n%s", bigLine, logs.String())
	}
	if dls := b.DeadLetters("t"); len(dls) != 1 || dls[0].Key != "big-1" {
		t.Fatalf("dead letters %+v; want big-1", dls)
	} else if dl := new(consumer.DeadLetterError); !errors.As(dls[0].Err, &dl) || dl.Key != "big-1" {
		t.Errorf("dead letter reason %v: want DeadLetterError.Key big-1", dls[0].Err)
	}
}

//go:noinline
func panicInHandler() { panic("boom") }
