package brokerenv_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
)

// TestDeleteTopicsAtCleanup: the topics a test named are gone from the
// cluster once the test ended, and a topic that never existed is no error.
func TestDeleteTopicsAtCleanup(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := runtest.UniqueName(t, "brokerenv")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(brokers...)}
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}}})
	if err != nil || res.Errors[topic] != nil {
		t.Fatalf("create %s: %v %v", topic, err, res)
	}
	t.Run("inner", func(t *testing.T) {
		brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, topic+"-never-created")
	})
	for {
		md, err := c.Metadata(ctx, &kafka.MetadataRequest{})
		if err == nil && !slices.ContainsFunc(md.Topics, func(tp kafka.Topic) bool { return tp.Name == topic }) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s still listed after the cleanup: %v", topic, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
