package kafkasource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemq/idemq/consumer"
)

// Ack marks msgs settled and requests, for every partition they belong to, the
// commit of the offset after the longest prefix of fetched messages that are
// all settled. It does not wait for the broker: the offsets are committed
// within Config.CommitInterval, when the group rebalances, or on Close,
// whichever comes first (see the package documentation for the redelivery
// window this leaves). A message behind an unsettled one is committed later,
// with the commit that passes it; until then a crash or rebalance redelivers
// it, which deduplication absorbs. Ack requests nothing for a partition whose
// newest settled message was fetched before the group's latest rebalance.
//
// An error means the request was not queued (or the source is closed); it is
// harmless, because the settled offsets are carried by the next request, and
// a redelivery in between is recognised as a duplicate.
func (s *Source) Ack(ctx context.Context, msgs []*consumer.Message) error {
	var errs []error
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return consumer.ErrClosed
	}
	for _, m := range msgs {
		e, err := s.entryOf(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.settleLocked(e)
	}
	s.mu.Unlock()
	if err := s.requestCommit(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Retry hands msg out again after delay with Attempt increased. Kafka has no
// negative acknowledgement, so the retry happens in this process: the
// message's offset stays uncommitted meanwhile, which keeps the commit of its
// partition from passing it, and if the process stops first the group
// redelivers it from the committed offset. Later messages with the same
// PartitionKey in the same partition that were fetched after the failure
// wait until msg is settled, so retries keep their order.
func (s *Source) Retry(_ context.Context, msg *consumer.Message, delay time.Duration) error {
	return s.redeliver(msg, msg.Attempt+1, delay)
}

// Release implements consumer.Releaser: it hands msg out again after delay,
// like Retry, with the same Attempt. The runner uses it when the message was
// not at fault (a database outage, a batch-mate's failure), so that such
// retries do not use up the message's attempts.
func (s *Source) Release(_ context.Context, msg *consumer.Message, delay time.Duration) error {
	return s.redeliver(msg, msg.Attempt, delay)
}

var _ consumer.Releaser = (*Source)(nil)

func (s *Source) redeliver(msg *consumer.Message, attempt int, delay time.Duration) error {
	e, err := s.entryOf(msg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return consumer.ErrClosed
	case e.settled:
		return fmt.Errorf("kafkasource: retry of %s: %w", msg.ID, ErrSettled)
	}
	s.blockLocked(e)
	s.redeliverLocked(e, attempt, delay)
	return nil
}

// redeliverLocked hands e out again as attempt after delay.
func (s *Source) redeliverLocked(e *entry, attempt int, delay time.Duration) {
	if t := s.timers[e]; t != nil {
		t.Stop()
	} else if h := s.holds[e.holdKey]; e.holdKey != "" && h != nil {
		h.waiting = append(h.waiting, e)
	}
	delay = max(delay, 0)
	e.timerSeq++
	e.due = time.Now().Add(delay)
	e.attempt = attempt
	seq := e.timerSeq
	s.stats.redelivered.Add(1)
	s.timers[e] = time.AfterFunc(delay, func() { s.redeliverDue(e, seq) })
}

// redeliverDue runs when e's redelivery timer fires. It hands e out together
// with every other due message of its key, in offset order: their timers race
// for s.mu, and a later message must not overtake an earlier one.
func (s *Source) redeliverDue(e *entry, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || e.settled || e.timerSeq != seq {
		return
	}
	due := []*entry{e}
	if h := s.holds[e.holdKey]; e.holdKey != "" && h != nil {
		now := time.Now()
		due = due[:0]
		kept := h.waiting[:0]
		for _, w := range h.waiting {
			if w == e || !w.due.After(now) {
				due = append(due, w)
			} else {
				kept = append(kept, w)
			}
		}
		clear(h.waiting[len(kept):])
		h.waiting = kept
		slices.SortFunc(due, func(a, b *entry) int { return cmp.Compare(a.offset, b.offset) })
	}
	for _, w := range due {
		if t := s.timers[w]; t != nil {
			t.Stop()
			delete(s.timers, w)
		}
		w.timerSeq++
		s.ready <- s.message(w, w.attempt)
	}
}
