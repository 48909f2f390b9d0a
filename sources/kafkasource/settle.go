package kafkasource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

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
	return s.handBack(msg, msg.Attempt+1, delay)
}

// Release implements consumer.Releaser: it hands msg out again after delay,
// like Retry, with the same Attempt. The runner uses it when the message was
// not at fault (a database outage, a batch-mate's failure), so that such
// retries do not use up the message's attempts.
func (s *Source) Release(_ context.Context, msg *consumer.Message, delay time.Duration, _ error) error {
	return s.handBack(msg, msg.Attempt, delay)
}

var _ consumer.Releaser = (*Source)(nil)

func (s *Source) handBack(msg *consumer.Message, attempt int, delay time.Duration) error {
	e, err := s.entryOf(msg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.unsettledLocked(context.Background(), e, "retry"); err != nil {
		return err
	}
	s.ledger.block(e)
	s.handBackLocked(e, attempt, delay)
	return nil
}

// unsettledLocked returns nil when e may still be retried or dead-lettered
// (what names which), else consumer.ErrClosed, ErrSettled, or
// consumer.ErrFenced for a message of an ended generation, which it drops.
func (s *Source) unsettledLocked(ctx context.Context, e *entry, what string) error {
	switch {
	case s.closed:
		return consumer.ErrClosed
	case e.settled:
		return fmt.Errorf("kafkasource: %s of %s: %w", what, e.id, ErrSettled)
	case s.endedLocked(e):
		s.dropLocked(ctx, e, what)
		return fmt.Errorf("kafkasource: %s of %s: %w", what, e.id, consumer.ErrFenced)
	}
	return nil
}

// settleLocked marks e settled, voids its pending redelivery, frees its
// slot, hands out the messages held behind it and gives back the retained
// tokens of the messages its partition's settled prefix passed.
func (s *Source) settleLocked(e *entry) {
	if e.settled {
		return
	}
	e.km = kafka.Message{} // the payload is no longer needed
	e.timerSeq++           // a pending redelivery is void
	if t := s.timers[e]; t != nil {
		t.Stop()
		delete(s.timers, e)
		s.ledger.unwait(e)
	}
	if e.slot {
		<-s.slots
		e.slot = false
	}
	s.inFlight--
	released, passed := s.ledger.settle(e)
	for _, q := range released {
		s.ready <- s.message(q, 1)
	}
	for range passed {
		<-s.retained
	}
}

// handBackLocked hands e out again as attempt after delay.
func (s *Source) handBackLocked(e *entry, attempt int, delay time.Duration) {
	if t := s.timers[e]; t != nil {
		t.Stop()
	} else {
		s.ledger.wait(e)
	}
	delay = max(delay, 0)
	e.timerSeq++
	e.due = time.Now().Add(delay)
	e.attempt = attempt
	seq := e.timerSeq
	s.stats.redelivered.Add(1)
	s.timers[e] = time.AfterFunc(delay, func() { s.handBackDue(e, seq) })
}

// handBackDue runs when e's redelivery timer fires. It hands e out together
// with every other due message of its key, in offset order: their timers race
// for s.mu, and a later message must not overtake an earlier one.
func (s *Source) handBackDue(e *entry, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || e.settled || e.timerSeq != seq {
		return
	}
	for _, w := range s.ledger.due(e, time.Now()) {
		if t := s.timers[w]; t != nil {
			t.Stop()
			delete(s.timers, w)
		}
		w.timerSeq++
		if s.endedLocked(w) { // due no longer counts it as waiting
			s.dropLocked(context.Background(), w, "retry")
			continue
		}
		s.ready <- s.message(w, w.attempt)
	}
}

// endedLocked reports whether e was fetched in a group generation that has
// ended. Its partition's owner in the current generation (this source or
// another member) fetches it again from the committed offset, which the
// settled prefix never moves past an unsettled message; a retry or dead
// letter of e would then repeat the new owner's. Unlike the commit fence's
// rebalance count, the count it compares does not move when a partition's
// leader changes, since the reader then goes on from where it was and
// fetches nothing again.
func (s *Source) endedLocked(e *entry) bool {
	return e.join < s.stats.joins.Load()
}

// dropLocked settles e, fetched in an ended generation, without an effect
// (what, "retry" or "dead letter", names the settle dropped): it no longer
// takes a slot nor blocks its key, and its partition's settled prefix passes
// it, but no commit of this source passes its offset until a message of a
// later generation at or past that offset settles (see ledger.settle).
func (s *Source) dropLocked(ctx context.Context, e *entry, what string) {
	s.stats.staleSettlesDropped.Add(1)
	s.log.InfoContext(ctx, what+" dropped: the message was fetched in a consumer-group generation that has ended; its partition's owner fetches it again",
		consumer.LogKeyID, e.id, logKeyGeneration, e.join)
	e.dropped = true
	s.settleLocked(e)
}
