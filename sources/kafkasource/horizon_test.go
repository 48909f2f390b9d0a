package kafkasource_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
)

// createTopicWithRetention creates a one-partition topic with the given
// retention.ms ("" for the broker's default), deleted when t ends.
func createTopicWithRetention(t *testing.T, brokers []string, retentionMS string) string {
	t.Helper()
	topic := runtest.UniqueName(t, "idemq-retention")
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc := kafka.TopicConfig{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}
	if retentionMS != "" {
		tc.ConfigEntries = []kafka.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: retentionMS}}
	}
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}}
	resp, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{tc}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	return topic
}

// The source reports its topics' retention.ms, and the Runner refuses a
// dedup retention below it: the broker's default (7 days by Kafka's default,
// 24 h on the test broker) passes with dedup.DefaultRetention, a topic keeping 10 days is refused, and a topic
// keeping messages for ever is reported as unbounded (a warning, not a
// refusal).
func TestRetentionGuard(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	for _, tc := range []struct {
		name      string
		retention string
		horizon   time.Duration
		refused   bool
	}{
		{"broker default", "", 0, false}, // whatever the broker's log.retention is
		{"ten days", "864000000", 10 * 24 * time.Hour, true},
		{"for ever", "-1", consumer.Unbounded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic := createTopicWithRetention(t, brokers, tc.retention)
			src := openSource(t, testConfig(t, brokers, topic, runtest.UniqueName(t, "group")))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			horizon, err := src.RedeliveryHorizon(ctx)
			if tc.horizon == 0 && err == nil && horizon > 0 && horizon <= dedup.DefaultRetention {
				tc.horizon = horizon
			}
			if err != nil || horizon != tc.horizon {
				t.Fatalf("RedeliveryHorizon = %v, %v; want %v", horizon, err, tc.horizon)
			}
			store, err := memdedup.New(memdedup.Config{Retention: dedup.DefaultRetention})
			if err != nil {
				t.Fatal(err)
			}
			r, err := consumer.NewRunner(src, consumer.Transactional(store, func(context.Context, *memdedup.Tx, *consumer.Message) error { return nil }),
				consumer.Config{Name: "retention", Logger: runtest.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			err = r.Run(rctx)
			rcancel()
			if got := errors.Is(err, idemq.ErrInvalidConfig); got != tc.refused {
				t.Fatalf("Run = %v, want refused %v", err, tc.refused)
			}
			t.Logf("horizon %v: Run = %v", horizon, err)
		})
	}
}
