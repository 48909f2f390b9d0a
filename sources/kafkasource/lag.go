package kafkasource

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
)

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
	var lags []consumer.PartitionLag
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for tp, next := range s.ledger.next(gen) {
		// Lag holds the next offset until the high watermark is known.
		lags = append(lags, consumer.PartitionLag{System: systemKafka, Topic: tp.topic, Partition: tp.partition, Lag: next})
		req.Topics[tp.topic] = append(req.Topics[tp.topic], kafka.LastOffsetOf(tp.partition))
	}
	s.mu.Unlock()
	if len(lags) == 0 {
		return nil, nil
	}

	resp, err := s.client.ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("kafkasource: list the high watermarks: %w", err)
	}
	hwm := map[topicPartition]int64{}
	for topic, parts := range resp.Topics {
		for _, po := range parts {
			if po.Error != nil {
				return nil, fmt.Errorf("kafkasource: high watermark of %s/%d: %w", topic, po.Partition, po.Error)
			}
			hwm[topicPartition{topic, po.Partition}] = po.LastOffset
		}
	}
	for i := range lags {
		l := &lags[i]
		last, ok := hwm[topicPartition{l.Topic, l.Partition}]
		if !ok {
			return nil, fmt.Errorf("kafkasource: no high watermark returned for %s/%d", l.Topic, l.Partition)
		}
		l.Lag = max(last-l.Lag, 0)
	}
	slices.SortFunc(lags, func(a, b consumer.PartitionLag) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return lags, nil
}
