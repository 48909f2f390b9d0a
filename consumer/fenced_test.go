package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// fencedSource is a source that has lost the messages' partition: it drops
// every dead letter and retry with ErrFenced, as kafkasource does for a
// message fetched before a rebalance.
type fencedSource struct {
	consumer.Source
	deadLetters, retries atomic.Int32
}

func (s *fencedSource) DeadLetter(_ context.Context, msg *consumer.Message, _ error) error {
	s.deadLetters.Add(1)
	return fmt.Errorf("test source: dead letter of %s: %w", msg.ID, consumer.ErrFenced)
}

func (s *fencedSource) Retry(_ context.Context, msg *consumer.Message, _ time.Duration) error {
	s.retries.Add(1)
	return fmt.Errorf("test source: retry of %s: %w", msg.ID, consumer.ErrFenced)
}

type deadLetterHook struct{ n atomic.Int32 }

func (h *deadLetterHook) OnDeadLetter(context.Context, *consumer.Message, consumer.DeadLetterReason, error) {
	h.n.Add(1)
}

// A settle the source fenced (the message's partition has a new owner,
// which settles it) is neither a dead letter nor a settle failure: the
// runner leaves the message to the broker and reports no dead letter.
func TestFencedSettleIsLeftToTheNewOwner(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"dead letter", consumer.Permanent(errors.New("poison"))},
		{"retry", errors.New("flaky")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := memBroker(t, memsource.Config{VisibilityTimeout: time.Minute})
			store := memStore(t)
			src := &fencedSource{Source: b.Source("t")}
			hook := new(deadLetterHook)
			path := consumer.Transactional(store, func(context.Context, *memdedup.Tx, *consumer.Message) error { return tc.err })
			r := newRunner(t, src, path, consumer.Config{Name: "fenced", Hooks: []consumer.Hook{hook}, Logger: runtest.Logger(t)})
			publishKeys(b, "k1")
			stop := runtest.Start(t, r)
			runtest.WaitFor(t, runtest.Timeout, runtest.Say("the fenced settle"), func() bool {
				return src.deadLetters.Load()+src.retries.Load() > 0
			})
			stop()
			if s := r.Stats(); s.DeadLettered != 0 || s.SettleFailures != 0 || hook.n.Load() != 0 {
				t.Fatalf("after a fenced settle: %d dead-lettered, %d settle failures, %d OnDeadLetter calls; want none",
					s.DeadLettered, s.SettleFailures, hook.n.Load())
			}
		})
	}
}
