package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// DeleteTopicsAtCleanup deletes topics from the Kafka cluster at brokers
// when t and its subtests end, so that test runs do not pile topics up on a
// long-lived broker. A topic that does not exist is fine; another failure is
// logged, not fatal.
func DeleteTopicsAtCleanup(t testing.TB, brokers []string, topics ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A transport of its own: kafka-go's default one pools connections
		// across tests, and a test that restarted the broker leaves it a
		// dead one.
		transport := &kafka.Transport{}
		defer transport.CloseIdleConnections()
		client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: transport}
		res, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
		if err != nil {
			t.Logf("delete topics %v: %v", topics, err)
			return
		}
		for topic, err := range res.Errors {
			if err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
				t.Logf("delete topic %s: %v", topic, err)
			}
		}
	})
}
