package kafkasource

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
)

// Stats counts what a Source did since it was created. Every counter only
// grows; InFlight and Held are current values.
type Stats struct {
	// Received is the number of messages fetched from Kafka, including the
	// group's redeliveries after rebalances and restarts.
	Received uint64
	// Retried is the number of messages handed out again in process:
	// retries, and messages handed out again after a failed dead-letter
	// write.
	Retried uint64
	// Commits is the number of successful offset commits (each may cover
	// several partitions). Commits are coalesced: at most one per
	// Config.CommitInterval, plus one when a generation ends and on Close.
	Commits uint64
	// CommitFailures is the number of offset commits that failed. Their
	// offsets are retried at the next CommitInterval tick of the same
	// generation; a failed commit at the end of a generation (or on Close)
	// leaves its messages to be redelivered and deduplicated.
	CommitFailures uint64
	// StaleCommitsSkipped is the number of partition commits not sent
	// because their messages were fetched before the group's latest
	// rebalance.
	StaleCommitsSkipped uint64
	// DeadLettered is the number of messages written to a dead-letter topic.
	DeadLettered uint64
	// DeadLetterFailures is the number of failed dead-letter writes.
	DeadLetterFailures uint64
	// StaleSettlesDropped is the number of retries, releases and dead
	// letters dropped because their message was fetched in a group
	// generation that has ended: the partition's owner in the new
	// generation fetches the message again and handles it.
	StaleSettlesDropped uint64
	// DeadLetterStuck is the number of messages whose dead-letter write
	// failed deadLetterStuckAfter times in a row. Such a message holds its
	// partition's commit until a write succeeds.
	DeadLetterStuck uint64
	// MembersLeft is the number of group members that kafka-go gave up
	// (it rejoins as a new member when it cannot reach the coordinator,
	// as while the broker restarts) and that the source then removed from
	// the group with a LeaveGroup of its own, so that the group rebalanced
	// without waiting for their session to expire (SessionTimeout).
	MembersLeft uint64
	// Rebalances is the number of consumer-group generations this source
	// joined (one per rebalance it took part in) plus the partition leader
	// changes its reader noticed: kafka-go counts both. A message fetched
	// before the latest of them is stale for the commit fence.
	Rebalances int64
	// InFlight is the number of messages fetched and not yet settled.
	InFlight int
	// Held is the number of messages waiting behind a retried message of
	// the same key.
	Held int
	// Uncommitted is the number of messages fetched and not yet passed by
	// their partition's settled prefix (bounded by Config.MaxUncommitted).
	Uncommitted int
}

type counters struct {
	fetched, redelivered, commits, commitFailures, staleCommitsSkipped atomic.Uint64
	deadLettered, deadLetterFailures, deadLetterStuck                  atomic.Uint64
	staleSettlesDropped, membersLeft                                   atomic.Uint64
	// joins counts the group generations the reader joined (see
	// readerLogger); unlike the rebalance count, a leader change does not
	// move it.
	joins atomic.Int64
	// abandoned carries the members kafka-go gave up to leaveAbandoned.
	abandoned chan string
}

// Stats returns a snapshot of the source's counters. It is safe to call at
// any time from any goroutine.
func (s *Source) Stats() Stats {
	gen := s.observeGeneration(context.Background()) // Stats takes no ctx
	s.mu.Lock()
	held, inFlight, uncommitted := s.ledger.held(), s.inFlight, s.ledger.uncommitted()
	s.mu.Unlock()
	c := s.stats
	return Stats{
		Received:            c.fetched.Load(),
		Retried:             c.redelivered.Load(),
		Commits:             c.commits.Load(),
		CommitFailures:      c.commitFailures.Load(),
		StaleCommitsSkipped: c.staleCommitsSkipped.Load(),
		DeadLettered:        c.deadLettered.Load(),
		DeadLetterFailures:  c.deadLetterFailures.Load(),
		DeadLetterStuck:     c.deadLetterStuck.Load(),
		StaleSettlesDropped: c.staleSettlesDropped.Load(),
		MembersLeft:         c.membersLeft.Load(),
		Rebalances:          gen,
		InFlight:            inFlight,
		Held:                held,
		Uncommitted:         uncommitted,
	}
}

var _ consumer.LagReporter = (*Source)(nil)

// Lag returns, for each partition the source fetched from in the current
// consumer-group generation, the number of messages at and after the first
// one not settled: the partition's high watermark, read from the brokers
// with one ListOffsets request bounded by ctx, minus the next offset the
// source will commit. A partition the group has assigned to this source but
// from which nothing was fetched since the latest rebalance (an idle
// partition) is not listed. Lag is safe for concurrent use; it returns
// consumer.ErrClosed after Close.
func (s *Source) Lag(ctx context.Context) ([]consumer.PartitionLag, error) {
	gen := s.observeGeneration(ctx)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, consumer.ErrClosed
	}
	next := s.ledger.next(gen)
	s.mu.Unlock()
	if len(next) == 0 {
		return nil, nil
	}

	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for tp := range next {
		req.Topics[tp.topic] = append(req.Topics[tp.topic], kafka.LastOffsetOf(tp.partition))
	}
	resp, err := s.client.ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("kafkasource: list the high watermarks: %w", err)
	}
	lags := make([]consumer.PartitionLag, 0, len(next))
	for topic, parts := range resp.Topics {
		for _, po := range parts {
			if po.Error != nil {
				return nil, fmt.Errorf("kafkasource: high watermark of %s/%d: %w", topic, po.Partition, po.Error)
			}
			if n, ok := next[topicPartition{topic, po.Partition}]; ok {
				delete(next, topicPartition{topic, po.Partition})
				lags = append(lags, consumer.PartitionLag{System: systemKafka, Topic: topic, Partition: po.Partition, Lag: max(po.LastOffset-n, 0)})
			}
		}
	}
	if len(next) > 0 {
		return nil, fmt.Errorf("kafkasource: no high watermark returned for %d partition(s)", len(next))
	}
	slices.SortFunc(lags, func(a, b consumer.PartitionLag) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return lags, nil
}
