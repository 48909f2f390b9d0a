package consumer

import (
	"context"
	"sync/atomic"
	"time"
)

// Stats counts what a Runner did since it was created. Every field only
// grows.
type Stats struct {
	// Received is the number of messages received from the source.
	Received uint64
	// Handled is the number of messages whose handler ran and whose effect
	// became durable (committed, or marked done on the lease path).
	Handled uint64
	// Duplicates is the number of messages acknowledged without running the
	// handler because their key was already processed.
	Duplicates uint64
	// Retried is the number of messages handed back for a later attempt
	// (Source.Retry or Releaser.Release returned nil). A failed hand-back
	// is counted in SettleFailures instead.
	Retried uint64
	// DeadLettered is the number of messages the source accepted into its
	// dead-letter route (Source.DeadLetter returned nil). A failed dead
	// letter is counted in SettleFailures instead.
	DeadLettered uint64
	// Mismatches is the number of dead-lettered messages whose key was
	// processed before with a different payload.
	Mismatches uint64
	// AckFailures is the number of messages whose acknowledgement failed
	// after their effect was durable. Their redeliveries are deduplicated.
	AckFailures uint64
	// CommitFailures is the number of transactions whose commit failed; none
	// of their messages was acknowledged.
	CommitFailures uint64
	// SettleFailures is the number of Retry or DeadLetter calls that failed;
	// those messages return through the broker.
	SettleFailures uint64
	// ReceiveFailures is the number of failed Receive calls.
	ReceiveFailures uint64
}

type counters struct {
	received, handled, duplicates, retried, deadLettered, mismatches atomic.Uint64
	ackFailures, commitFailures, settleFailures, receiveFailures     atomic.Uint64
	// left counts messages neither acknowledged nor handed back: a failed
	// retry or dead letter, or a message whose work the drain cut short.
	// The broker redelivers them; WaitIdle counts them as settled.
	left atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Received:        c.received.Load(),
		Handled:         c.handled.Load(),
		Duplicates:      c.duplicates.Load(),
		Retried:         c.retried.Load(),
		DeadLettered:    c.deadLettered.Load(),
		Mismatches:      c.mismatches.Load(),
		AckFailures:     c.ackFailures.Load(),
		CommitFailures:  c.commitFailures.Load(),
		SettleFailures:  c.settleFailures.Load(),
		ReceiveFailures: c.receiveFailures.Load(),
	}
}

// waitIdle is Runner.WaitIdle over c.
func (c *counters) waitIdle(ctx context.Context, idle time.Duration) error {
	poll := min(max(idle/10, time.Millisecond), 100*time.Millisecond)
	t := time.NewTicker(poll)
	defer t.Stop()
	progress := func() (uint64, bool) {
		s := c.snapshot()
		settled := s.Handled + s.Duplicates + s.Retried + s.DeadLettered + c.left.Load()
		return s.Received + settled, settled >= s.Received
	}
	last, _ := progress()
	since := time.Now()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		n, drained := progress()
		switch {
		case n != last || !drained:
			last, since = n, time.Now()
		case time.Since(since) >= idle:
			return nil
		}
	}
}
