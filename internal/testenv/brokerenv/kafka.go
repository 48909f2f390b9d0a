package brokerenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// DeleteTopicsAtCleanup deletes topics from the Kafka cluster at brokers
// when t and its subtests end, so that test runs do not pile topics up on a
// long-lived broker. A topic that does not exist is fine; another failure is
// logged, not fatal. It talks to the cluster through kafka-go directly, so
// that the test kit imports nothing of idemq.
func DeleteTopicsAtCleanup(t testing.TB, brokers []string, topics ...string) {
	t.Helper()
	t.Cleanup(func() {
		if len(topics) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := deleteTopics(ctx, brokers, topics); err != nil {
			t.Logf("delete topics %v: %v", topics, err)
		}
	})
}

// deleteTopics asks the cluster's controller (kafka-go's Client finds it) to
// delete topics, and reports every failure but a topic that does not exist.
func deleteTopics(ctx context.Context, brokers, topics []string) error {
	c := &kafka.Client{Addr: kafka.TCP(brokers...)}
	res, err := c.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
	if err != nil {
		return err
	}
	var errs []error
	for topic, err := range res.Errors {
		if err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
			errs = append(errs, fmt.Errorf("%s: %w", topic, err))
		}
	}
	return errors.Join(errs...)
}

// LastOffset returns the end offset of topic's partition, the offset its
// next message gets, from the partition's leader (found through brokers[0]).
// It asks again while the leader answers with a retriable error (a partition
// just created is led in the metadata a moment before its leader serves it)
// and fails t after 30 s.
func LastOffset(t testing.TB, brokers []string, topic string, partition int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		last, err := lastOffset(ctx, brokers[0], topic, partition)
		if err == nil {
			return last
		}
		var ke kafka.Error
		if !errors.As(err, &ke) || !ke.Temporary() {
			t.Fatalf("last offset of %s/%d: %v", topic, partition, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("last offset of %s/%d: %v (%v)", topic, partition, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func lastOffset(ctx context.Context, addr, topic string, partition int) (int64, error) {
	conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, partition)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return conn.ReadLastOffset()
}
