package sqssource

import "sync/atomic"

// Stats counts what a Source did since it was created. Every field only
// grows.
type Stats struct {
	// Received is the number of messages ReceiveMessage returned.
	Received uint64
	// Deleted is the number of messages Ack deleted.
	Deleted uint64
	// Retried is the number of messages Retry made visible again later.
	Retried uint64
	// DeadLettered is the number of messages DeadLetter routed.
	DeadLettered uint64
	// Extended is the number of visibility extensions the heartbeat made.
	Extended uint64
	// Expired is the number of messages the heartbeat stopped extending
	// because they had been in flight for Config.MaxExtension.
	Expired uint64
	// Released is the number of unsettled messages Close made visible again.
	Released uint64
	// ReceiveFailures is the number of failed ReceiveMessage calls.
	ReceiveFailures uint64
	// DeleteFailures is the number of messages whose deletion failed.
	DeleteFailures uint64
	// ExtendFailures is the number of failed visibility extensions.
	ExtendFailures uint64
}

// Stats returns a snapshot of the source's counters. It is safe to call at any
// time from any goroutine.
func (s *Source) Stats() Stats {
	c := &s.stats
	return Stats{
		Received:        c.received.Load(),
		Deleted:         c.deleted.Load(),
		Retried:         c.retried.Load(),
		DeadLettered:    c.deadLettered.Load(),
		Extended:        c.extended.Load(),
		Expired:         c.expired.Load(),
		Released:        c.released.Load(),
		ReceiveFailures: c.receiveFailures.Load(),
		DeleteFailures:  c.deleteFailures.Load(),
		ExtendFailures:  c.extendFailures.Load(),
	}
}

// counters back Stats.
type counters struct {
	received, deleted, retried, deadLettered, extended, released atomic.Uint64
	receiveFailures, deleteFailures, extendFailures, expired     atomic.Uint64
}
