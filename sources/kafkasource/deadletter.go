package kafkasource

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/metatext"
	"github.com/idemq/idemq/sources/internal/brokerkit"
)

// DeadLetter writes a copy of msg to the dead-letter topic
// (Config.DeadLetterTopic, by default "<topic>.dlq"): the original key,
// value and headers plus consumer.MetaReason (cut to maxReasonBytes),
// consumer.MetaAttempts, MetaOriginTopic, MetaOriginPartition,
// MetaOriginOffset, MetaGroup, consumer.MetaKey and
// consumer.MetaDeadLetteredAt, their text made fit for every broker by
// internal/metatext.Clean. It waits until every in-sync replica has the
// copy, and only then settles msg and requests its commit as Ack does; a
// commit failure after that is only logged, since the copy is durable.
//
// A message fetched in a consumer-group generation that has ended is not
// written: DeadLetter, like Retry, Release and a pending retry that comes
// due, drops it (Stats.StaleSettlesDropped) and returns an error matching
// consumer.ErrFenced, and the partition's owner in the new generation
// routes it.
//
// If the write fails, the error is returned and msg stays uncommitted and
// is handed out again after Config.DeadLetterRetryDelay, so nothing is
// lost; but its partition's commit cannot pass it until a write succeeds.
// A write that never succeeds (a missing topic, a denied ACL, a copy too
// large) blocks that commit for good and stops fetching once
// Config.MaxUncommitted messages are retained; from the
// deadLetterStuckAfter-th consecutive failure on, each failure is logged at
// Error level and Stats.DeadLetterStuck counts the message.
func (s *Source) DeadLetter(ctx context.Context, msg *consumer.Message, reason error) error {
	e, err := s.entryOf(msg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if err := s.unsettledLocked(ctx, e, "dead letter"); err != nil {
		s.mu.Unlock()
		return err
	}
	km := e.km
	s.mu.Unlock()

	dead := s.deadLetterCopy(km, msg, reason)
	wctx, cancel := context.WithTimeout(ctx, s.cfg.DeadLetterTimeout)
	err = s.dlq.WriteMessages(wctx, dead)
	cancel()
	if err != nil {
		s.stats.deadLetterFailures.Add(1)
		s.mu.Lock()
		failures := 0
		if !s.closed && !e.settled {
			e.deadLetterFailures++
			failures = e.deadLetterFailures
			s.ledger.block(e)
			s.handBackLocked(e, msg.Attempt, s.cfg.DeadLetterRetryDelay)
		}
		s.mu.Unlock()
		level := slog.LevelWarn
		if failures >= deadLetterStuckAfter {
			level = slog.LevelError
			if failures == deadLetterStuckAfter {
				s.stats.deadLetterStuck.Add(1)
			}
		}
		s.log.Log(ctx, level, "dead-letter write failed; the message blocks its partition's commit until a write succeeds",
			consumer.LogKeyID, msg.ID, consumer.LogKeyQueue, dead.Topic, consumer.LogKeyCount, failures,
			consumer.LogKeyError, err)
		return fmt.Errorf("kafkasource: dead-letter %s to topic %q (handed out again in %s): %w",
			msg.ID, dead.Topic, s.cfg.DeadLetterRetryDelay, err)
	}
	s.stats.deadLettered.Add(1)

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil // durable copy; the uncommitted original comes back and is copied again
	}
	s.settleLocked(e)
	s.mu.Unlock()
	if err := s.requestCommit(ctx); err != nil {
		s.log.WarnContext(ctx, "offset commit request after dead-letter failed; a redelivery may be dead-lettered again",
			consumer.LogKeyID, msg.ID, consumer.LogKeyError, err)
	}
	return nil
}

// deadLetterCopy builds the dead-letter message for km.
func (s *Source) deadLetterCopy(km kafka.Message, msg *consumer.Message, reason error) kafka.Message {
	attempts, key := brokerkit.Recorded(reason, msg.Attempt, msg.Key)
	headers := make([]kafka.Header, 0, len(km.Headers)+8)
	for _, h := range km.Headers {
		if !isDeadLetterHeader(h.Key) {
			headers = append(headers, h)
		}
	}
	headers = append(headers,
		kafka.Header{Key: consumer.MetaReason, Value: []byte(brokerkit.ReasonText(reason, maxReasonBytes))},
		kafka.Header{Key: consumer.MetaAttempts, Value: []byte(strconv.Itoa(attempts))},
		kafka.Header{Key: MetaOriginTopic, Value: []byte(km.Topic)},
		kafka.Header{Key: MetaOriginPartition, Value: []byte(strconv.Itoa(km.Partition))},
		kafka.Header{Key: MetaOriginOffset, Value: []byte(strconv.FormatInt(km.Offset, 10))},
		kafka.Header{Key: MetaGroup, Value: []byte(metatext.Clean(s.cfg.GroupID, maxReasonBytes))},
		kafka.Header{Key: consumer.MetaDeadLetteredAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	)
	if key != "" {
		headers = append(headers, kafka.Header{Key: consumer.MetaKey, Value: []byte(metatext.Clean(key, consumer.MaxKeyBytes))})
	}
	return kafka.Message{
		Topic:   s.cfg.deadLetterTopic(km.Topic),
		Key:     km.Key,
		Value:   km.Value,
		Headers: headers,
	}
}

// maxReasonBytes is the longest consumer.MetaReason value written; a longer reason
// is cut (see metatext.Clean) and ends with " ...(truncated)".
const maxReasonBytes = 4096

func isDeadLetterHeader(k string) bool {
	switch k {
	case consumer.MetaReason, consumer.MetaAttempts, MetaOriginTopic, MetaOriginPartition, MetaOriginOffset,
		MetaGroup, consumer.MetaKey, consumer.MetaDeadLetteredAt:
		return true
	}
	return false
}
