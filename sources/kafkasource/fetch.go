package kafkasource

import (
	"context"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/internal/brokerkit"
)

// Receive blocks until at least one message is available, then returns up to
// limit of them (at least one). It returns ctx.Err() when ctx is done,
// consumer.ErrClosed after Close, and the latest fetch error (a broker or
// group failure, which the Runner retries with backoff) when one occurred
// since the last call and no message is ready. Receive commits nothing.
func (s *Source) Receive(ctx context.Context, limit int) ([]*consumer.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case <-s.closing:
		return nil, consumer.ErrClosed
	default:
	}
	limit = max(limit, 1)
	// Messages first: a fetch error of one partition must not hold up the
	// messages of the others.
	select {
	case m := <-s.ready:
		return s.drain(m, limit), nil
	default:
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.closing:
		return nil, consumer.ErrClosed
	case m := <-s.ready:
		return s.drain(m, limit), nil
	case err := <-s.errs:
		return nil, err
	}
}

// drain returns first and up to limit-1 more ready messages, without
// blocking.
func (s *Source) drain(first *consumer.Message, limit int) []*consumer.Message {
	out := make([]*consumer.Message, 1, min(limit, 1+len(s.ready)))
	out[0] = first
	for len(out) < limit {
		select {
		case m := <-s.ready:
			out = append(out, m)
		default:
			return out
		}
	}
	return out
}

// fetchLoop fetches messages while fewer than MaxUncommitted are retained and
// fewer than MaxInFlight are unsettled and not held, until ctx is cancelled.
func (s *Source) fetchLoop(ctx context.Context) {
	failures := 0
	var warnings brokerkit.Warnings
	for {
		select {
		case s.retained <- struct{}{}:
		case <-ctx.Done():
			return
		}
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		km, err := s.reader.FetchMessage(ctx)
		if err != nil {
			<-s.slots
			<-s.retained
			// Close cancels ctx before it closes the reader, so an
			// io.EOF with ctx alive is the broker's: a connection that
			// the broker (or the network) closed while it was away.
			// Returning on it stopped fetching for good after an outage.
			if ctx.Err() != nil {
				return
			}
			failures++
			err = fmt.Errorf("kafkasource: fetch: %w", err)
			// The attempts come every fetchBackoff.
			if warnings.Due(failures) {
				s.log.WarnContext(ctx, "fetch failed", consumer.LogKeyError, err, consumer.LogKeyAttempt, failures)
			}
			select {
			case s.errs <- err:
			default: // an earlier error is still waiting to be reported
			}
			brokerkit.Sleep(ctx.Done(), fetchBackoff(failures))
			continue
		}
		failures = 0
		s.admit(km, s.observeGeneration(ctx))
	}
}

// admit records a fetched message in its partition's commit queue and hands
// it out, or holds it behind a retried message of the same key.
func (s *Source) admit(km kafka.Message, gen int64) {
	e := &entry{
		src:    s,
		km:     km,
		offset: km.Offset,
		gen:    gen,
		join:   s.stats.joins.Load(),
		id:     messageID(km),
		slot:   true,
	}
	e.key, e.keyErr = s.keyOf(km)
	switch s.cfg.Ordering {
	case OrderByPartition:
		e.partitionKey = km.Topic + "/" + strconv.Itoa(km.Partition)
		e.holdKey = e.partitionKey
	default:
		if len(km.Key) > 0 {
			e.partitionKey = string(km.Key)
			e.holdKey = km.Topic + "/" + strconv.Itoa(km.Partition) + "/" + e.partitionKey
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	held := s.ledger.record(topicPartition{km.Topic, km.Partition}, e)
	s.inFlight++
	s.stats.fetched.Add(1)
	if held {
		// A held message gives its fetch slot back, so that one retried
		// message (with OrderByPartition: one retried partition) does
		// not stop the fetching of the others; MaxUncommitted still
		// bounds the held messages.
		<-s.slots
		e.slot = false
		return
	}
	s.ready <- s.message(e, 1)
}

// messageID returns the ID of km's message: "<topic>/<partition>/<offset>",
// built in one allocation.
func messageID(km kafka.Message) string {
	var buf [96]byte
	b := append(buf[:0], km.Topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(km.Partition), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, km.Offset, 10)
	return string(b)
}

// keyOf returns the deduplication key the message carries, or "". A panic
// of Config.KeyFunc is returned as an error, which the runner dead-letters
// the message with, instead of crashing the fetch loop.
func (s *Source) keyOf(km kafka.Message) (key string, err error) {
	if s.cfg.KeyFunc != nil {
		defer func() {
			if v := recover(); v != nil {
				key, err = "", &consumer.PanicError{Value: v, Stack: debug.Stack()}
			}
		}()
		return s.cfg.KeyFunc(km), nil
	}
	key = ""
	for _, h := range km.Headers {
		if h.Key == s.cfg.KeyHeader {
			key = string(h.Value) // the last one wins, as for Headers
		}
	}
	return key, nil
}

// message builds the consumer.Message of one delivery of e.
func (s *Source) message(e *entry, attempt int) *consumer.Message {
	headers := make(map[string]string, len(e.km.Headers))
	for _, h := range e.km.Headers {
		if h.Key == s.cfg.KeyHeader && s.cfg.KeyFunc == nil && e.key == string(h.Value) {
			headers[h.Key] = e.key // the same string, not a copy
			continue
		}
		headers[h.Key] = string(h.Value)
	}
	var key string
	switch {
	case len(e.km.Key) == 0:
	case e.partitionKey == string(e.km.Key):
		key = e.partitionKey // the same string, not a copy
	default:
		key = string(e.km.Key)
	}
	broker := messageBroker(s.broker, s.cfg.GroupID, e.km.Partition, e.km.Offset, key)
	return consumer.Deliver(&consumer.Message{
		ID:            e.id,
		Key:           e.key,
		Body:          e.km.Value,
		Headers:       headers,
		PartitionKey:  e.partitionKey,
		Topic:         e.km.Topic,
		Attempt:       attempt,
		Redelivered:   attempt > 1,
		ReplyTo:       headers[consumer.HeaderReplyTo],
		CorrelationID: headers[consumer.HeaderCorrelationID],
		ReceivedAt:    time.Now(),
		Raw:           e.km,
		Broker:        broker,
	}, consumer.Delivery{Handle: e, KeyErr: e.keyErr})
}

// observeGeneration returns the reader's rebalance count so far. kafka-go
// counts every consumer-group generation it joins, before it starts that
// generation's partition readers (so a message fetched after this count was
// read belongs to the generation counted or an older one), and also every
// time a partition reader loses its partition's leader. The count is
// therefore a conservative generation tag: it grows at least once per
// generation, and a growth without a rebalance only makes the fence skip
// commits that were safe. A growth is logged with ctx.
func (s *Source) observeGeneration(ctx context.Context) int64 {
	s.genMu.Lock()
	defer s.genMu.Unlock()
	if n := s.reader.Stats().Rebalances; n > 0 {
		g := s.gen.Add(n)
		s.log.InfoContext(ctx, "consumer group rebalanced or partition leader moved", logKeyGeneration, g)
	}
	return s.gen.Load()
}

// maxFetchBackoff caps the pause between fetch attempts, and so how long
// fetching waits once the broker answers again.
const maxFetchBackoff = 500 * time.Millisecond

// fetchBackoff is the pause after the n-th consecutive fetch failure:
// 100 ms doubling up to maxFetchBackoff.
func fetchBackoff(n int) time.Duration {
	return min(100*time.Millisecond<<min(max(n-1, 0), 10), maxFetchBackoff)
}

// The OpenTelemetry messaging attributes the source puts in
// consumer.Message.Broker, named as semantic conventions v1.41.0 name them.
const (
	systemKafka     = "kafka"
	attrGroup       = "messaging.consumer.group.name"
	attrPartition   = "messaging.destination.partition.id"
	attrOffset      = "messaging.kafka.offset"
	attrMessageKey  = "messaging.kafka.message.key"
	settleOperation = "commit"
)

// brokerInfo returns the consumer.BrokerInfo of the messages of a source
// reading from the bootstrap address server: system "kafka", an
// acknowledgement named "commit", IDs made of topic, partition and offset,
// and redeliveries after a rebalance unmarked.
func brokerInfo(server string) consumer.BrokerInfo {
	return consumer.BrokerInfo{System: systemKafka, SettleName: settleOperation,
		SyntheticID: true, UnmarkedRedeliveries: true}.WithServer(server)
}

// messageBroker returns b for the message of group at offset of partition,
// with key (the Kafka message key, empty for none): the destination's
// attributes messaging.consumer.group.name and
// messaging.destination.partition.id, and the message's own
// messaging.kafka.offset and messaging.kafka.message.key (when it has one).
// One allocation holds them all.
func messageBroker(b consumer.BrokerInfo, group string, partition int, offset int64, key string) consumer.BrokerInfo {
	attrs := make([]consumer.BrokerAttr, 2, 4)
	attrs[0] = consumer.StringAttr(attrGroup, group)
	attrs[1] = consumer.StringAttr(attrPartition, strconv.Itoa(partition))
	attrs = append(attrs, consumer.IntAttr(attrOffset, offset))
	if key != "" {
		attrs = append(attrs, consumer.StringAttr(attrMessageKey, key))
	}
	b.Attrs, b.MessageAttrs = attrs[:2:2], attrs[2:]
	return b
}
