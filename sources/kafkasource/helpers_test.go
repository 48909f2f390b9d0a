package kafkasource_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// testPartitions is the partition count of test topics unless a test asks for
// another.
const testPartitions = 4

// waitTimeout bounds every wait of these tests for messages or rows.
const waitTimeout = 60 * time.Second

// skipShort skips tests that need the real services under -short (make
// test-short); without -short, a missing service fails them.
func skipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Kafka (and PostgreSQL); skipped with -short")
	}
}

// newTopic creates a fresh topic with its dead-letter topic, and deletes both
// when the test ends.
func newTopic(t testing.TB, brokers []string, partitions int) string {
	t.Helper()
	topic := runtest.UniqueName(t, "idemq")
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, kafkasource.DeadLetterTopic(topic))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := kafkasource.CreateTopics(ctx, nil, brokers,
		kafkasource.TopicSpec{Name: topic, Partitions: partitions},
		kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(topic), Partitions: 1},
	)
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	return topic
}

// testConfig returns a source configuration with group timeouts short enough
// for tests (the broker's minimum session timeout is 6 s).
func testConfig(t testing.TB, brokers []string, topic, group string) kafkasource.Config {
	return kafkasource.Config{
		Brokers:              brokers,
		Topics:               []string{topic},
		GroupID:              group,
		SessionTimeout:       6 * time.Second,
		HeartbeatInterval:    300 * time.Millisecond,
		RebalanceTimeout:     10 * time.Second,
		JoinGroupBackoff:     200 * time.Millisecond,
		MaxWait:              250 * time.Millisecond,
		DeadLetterRetryDelay: 500 * time.Millisecond,
		CommitInterval:       testCommitInterval,
		Logger:               runtest.Logger(t),
	}
}

// testCommitInterval is the CommitInterval of testConfig.
const testCommitInterval = 100 * time.Millisecond

// waitOffset waits until the group's committed offset of partition 0 of
// topic is want, and fails t if it is not within waitTimeout.
func waitOffset(t testing.TB, brokers []string, group, topic string, want int64) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		got := committedOffsets(t, brokers, group, topic, 1)[0]
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed offset %d after %s, want %d", got, waitTimeout, want)
		}
		time.Sleep(testCommitInterval / 2)
	}
}

// afterCommitTicks gives the source's commit loop several CommitInterval
// ticks to send anything it would send, so that a check that nothing was
// committed is not vacuous.
func afterCommitTicks() { time.Sleep(5 * testCommitInterval) }

// openSource opens a source and closes it when the test ends.
func openSource(t testing.TB, cfg kafkasource.Config) *kafkasource.Source {
	t.Helper()
	src, err := kafkasource.New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("kafkasource.New: %v", err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// publish writes msgs to topic and returns once all in-sync replicas have
// them. The key goes into the default key header, PartitionKey becomes the
// Kafka message key.
func publish(t testing.TB, brokers []string, topic string, msgs ...sourcetest.Outgoing) {
	t.Helper()
	if len(msgs) == 0 {
		return
	}
	// A transport of its own: the shared default one caches metadata and
	// would not know a topic created after its last refresh.
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Transport:    tr,
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		BatchSize:    1000,
		BatchBytes:   16 << 20,
	}
	defer w.Close()
	kms := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		km := kafka.Message{Value: m.Body}
		if m.PartitionKey != "" {
			km.Key = []byte(m.PartitionKey)
		}
		if m.Key != "" {
			km.Headers = append(km.Headers, kafka.Header{Key: kafkasource.DefaultKeyHeader, Value: []byte(m.Key)})
		}
		for k, v := range m.Headers {
			km.Headers = append(km.Headers, kafka.Header{Key: k, Value: []byte(v)})
		}
		kms[i] = km
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, kms...); err != nil {
		t.Fatalf("publish %d message(s) to %s: %v", len(msgs), topic, err)
	}
}

// readTopic returns every message currently in topic (all partitions, from
// the start to the high watermark), without a consumer group.
func readTopic(t testing.TB, brokers []string, topic string) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions(topic)
	if err != nil {
		t.Fatalf("partitions of %s: %v", topic, err)
	}
	var out []kafka.Message
	for _, p := range parts {
		last := brokerenv.LastOffset(t, brokers, topic, p.ID)
		if last == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p.ID, MaxWait: 250 * time.Millisecond})
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("read %s/%d: %v", topic, p.ID, err)
			}
			out = append(out, m)
			if m.Offset+1 >= last {
				break
			}
		}
		r.Close()
	}
	return out
}

// header returns the value of the last header named key.
func header(m kafka.Message, key string) string {
	v := ""
	for _, h := range m.Headers {
		if h.Key == key {
			v = string(h.Value)
		}
	}
	return v
}

// committedOffsets returns the group's committed offset of every partition of
// topic (-1 where none is committed).
func committedOffsets(t testing.TB, brokers []string, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A transport of its own: no pooled connection that the broker may
	// have closed in the meantime.
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: transport}
	ids := make([]int, partitions)
	for i := range ids {
		ids[i] = i
	}
	var (
		resp *kafka.OffsetFetchResponse
		err  error
	)
	for attempt := 1; ; attempt++ {
		resp, err = c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
		if err == nil || attempt == 5 || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond) // a connection dropped under load: ask again
	}
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	if resp.Error != nil {
		t.Fatalf("offset fetch: %v", resp.Error)
	}
	out := make(map[int]int64, partitions)
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("offset fetch %s/%d: %v", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// receiveN receives until n messages arrived or the timeout passes.
func receiveN(t testing.TB, src consumer.Source, n int, timeout time.Duration) []*consumer.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []*consumer.Message
	for len(got) < n {
		msgs, err := src.Receive(ctx, n-len(got))
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("received %d of %d messages within %s", len(got), n, timeout)
			}
			// A transient fetch error, reported for the runner's backoff.
			t.Logf("Receive: %v", err)
			continue
		}
		got = append(got, msgs...)
	}
	return got
}
