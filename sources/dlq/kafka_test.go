package dlq_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/offsetcommit"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/dlq"
	"github.com/idemq/idemq/sources/dlq/kafkadlq"
	"github.com/idemq/idemq/sources/kafkasource"
)

func init() {
	childBrokers["TestKafka"] = func(t *testing.T, env func(string) string) dlq.Broker {
		return openKafkaDLQ(t, strings.Split(env("IDEMQ_DLQ_BROKERS"), ","), env("IDEMQ_DLQ_TOPIC"),
			&killingTransport{RoundTripper: &kafka.Transport{}})
	}
}

// killingTransport SIGKILLs the process as it is about to commit the
// progress of a dead letter past killAfter(): its copy is acknowledged at
// the origin, its removal not recorded.
type killingTransport struct {
	kafka.RoundTripper
	commits atomic.Int64
}

func (k *killingTransport) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	if _, ok := req.(*offsetcommit.Request); ok {
		killAtRemoval(&k.commits)
	}
	return k.RoundTripper.RoundTrip(ctx, addr, req)
}

func openKafkaDLQ(t *testing.T, brokers []string, topic string, tr kafka.RoundTripper) *kafkadlq.Broker {
	t.Helper()
	b, err := kafkadlq.New(kafkadlq.Config{Brokers: brokers, Topic: topic, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestKafka(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := runtest.UniqueName(t, "idemq-dlq")
	dead := kafkasource.DeadLetterTopic(topic)
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, dead)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers,
		kafkasource.TopicSpec{Name: topic, Partitions: 2},
		kafkasource.TopicSpec{Name: dead, Partitions: 2},
	); err != nil {
		t.Fatal(err)
	}
	group := runtest.UniqueName(t, "g")
	runScenario(t, rig{
		publish: func(t *testing.T, key, body string) {
			tr := &kafka.Transport{}
			defer tr.CloseIdleConnections()
			w := &kafka.Writer{Transport: tr, Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{},
				RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
			defer w.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := w.WriteMessages(ctx, kafka.Message{Key: []byte(key), Value: []byte(body), Headers: []kafka.Header{
				{Key: kafkasource.DefaultKeyHeader, Value: []byte(key)}, {Key: "tenant", Value: []byte("acme")},
			}}); err != nil {
				t.Fatal(err)
			}
		},
		source: func(t *testing.T) consumer.Source {
			src, err := kafkasource.New(context.Background(), kafkasource.Config{
				Brokers: brokers, Topics: []string{topic}, GroupID: group,
				SessionTimeout: 6 * time.Second, HeartbeatInterval: 300 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
				JoinGroupBackoff: 200 * time.Millisecond, MaxWait: 250 * time.Millisecond, CommitInterval: 100 * time.Millisecond,
				Logger: runtest.Logger(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { src.Close() })
			return src
		},
		broker: func(t *testing.T) dlq.Broker { return openKafkaDLQ(t, brokers, dead, nil) },
		// The dead-letter topic keeps what was replayed: rewinding the
		// progress group replays it all again.
		again: func(t *testing.T, _ dlq.Broker) {
			c := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := c.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: kafkadlq.DefaultGroup, GenerationID: -1,
				Topics: map[string][]kafka.OffsetCommit{dead: {{Partition: 0, Offset: 0}, {Partition: 1, Offset: 0}}}})
			if err != nil {
				t.Fatal(err)
			}
		},
		childEnv:     []string{"IDEMQ_DLQ_BROKERS=" + strings.Join(brokers, ","), "IDEMQ_DLQ_TOPIC=" + dead},
		killInWindow: true,
	})
}
