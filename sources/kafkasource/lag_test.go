package kafkasource_test

import (
	"context"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
)

// TestLagPerPartition checks Lag against the real Kafka: it counts, per
// partition, the messages at and after the first one not settled.
func TestLagPerPartition(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, outgoing("lag", 10)...)

	src := openSource(t, testConfig(t, brokers, topic, group))
	if lags, err := src.Lag(context.Background()); err != nil || len(lags) != 0 {
		t.Fatalf("Lag before any fetch = %+v, %v; want nothing", lags, err)
	}
	msgs := sortByOffset(receiveN(t, src, 10, waitTimeout))
	// Offsets 0-3 settled, 5 settled behind the unsettled 4.
	if err := src.Ack(context.Background(), []*consumer.Message{msgs[0], msgs[1], msgs[2], msgs[3], msgs[5]}); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	publish(t, brokers, topic, outgoing("later", 2)...) // not fetched yet, still lag
	lags, err := src.Lag(context.Background())
	if err != nil {
		t.Fatalf("Lag: %v", err)
	}
	want := consumer.PartitionLag{System: "kafka", Topic: topic, Partition: 0, Lag: 12 - 4}
	if len(lags) != 1 || lags[0] != want {
		t.Fatalf("Lag = %+v, want [%+v]", lags, want)
	}
}
