package kafkaoutbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sinks/outbox/kafkaoutbox"
	"github.com/idemq/idemq/sources/kafkasource"
)

const partitions = 3

func newTopic(t testing.TB, brokers []string) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	topic := "idemq-outbox-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")) + "-" + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic, Partitions: partitions}); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic)
	return topic
}

// readAll reads every message of topic, partition by partition, in offset
// order.
func readAll(t testing.TB, brokers []string, topic string) []relaytest.Got {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []relaytest.Got
	for p := range partitions {
		last := brokerenv.LastOffset(t, brokers, topic, p)
		if last == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		for n := int64(0); n < last; n++ {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("read partition %d: %v", p, err)
			}
			g := relaytest.Got{Key: string(m.Key), Body: string(m.Value)}
			for _, h := range m.Headers {
				if h.Key == outbox.HeaderIdempotencyKey {
					g.ID = string(h.Value)
				}
			}
			got = append(got, g)
		}
		r.Close()
	}
	return got
}

func newPublisher(t testing.TB, brokers []string) *kafkaoutbox.Publisher {
	t.Helper()
	pub, err := kafkaoutbox.New(kafkaoutbox.Config{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// Every row reaches the topic once with its stable id, in order per key; a
// row for a topic that does not exist is parked with its error after
// MaxAttempts, and does not hold up the others.
func TestRelayKafka(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers)
	pool, _, _ := relaytest.NewPool(t)
	want := relaytest.Messages("m", topic, 300, 7)
	relaytest.Insert(t, pool, want)
	relaytest.Insert(t, pool, []outbox.Message{{ID: "poison", Destination: topic + "-missing", Key: "k-poison", Body: []byte("x")}})

	relaytest.StartRelays(t, pool, newPublisher(t, brokers), 1, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		c := relaytest.Counts(t, pool)
		return c.Pending == 0 && c.Parked == 1
	})
	if c := relaytest.Counts(t, pool); c.Sent != int64(len(want)) {
		t.Fatalf("counts %s, want %d sent", fmtCounts(c), len(want))
	}
	var lastErr string
	var attempts int
	if err := pool.QueryRow(context.Background(), `SELECT attempts, last_error FROM idemq_outbox WHERE id = 'poison'`).Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if attempts != relaytest.FastConfig().MaxAttempts || !strings.Contains(lastErr, outbox.ErrNoDestination.Error()) {
		t.Fatalf("poison row: attempts %d, last error %q", attempts, lastErr)
	}
	relaytest.Check(t, want, readAll(t, brokers, topic), false)
}

// Two relays at once, with two batches in flight each, publish every row
// once and keep each key's order.
func TestRelayKafkaConcurrent(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers)
	pool, _, _ := relaytest.NewPool(t)
	pub := newPublisher(t, brokers)
	cfg := relaytest.FastConfig()
	cfg.BatchSize = 10
	cfg.Concurrency = 2
	relaytest.StartRelays(t, pool, pub, 2, cfg)
	// Rows arrive while the relays run, woken by notifications.
	want := relaytest.Messages("c", topic, 400, 5)
	for i := 0; i < len(want); i += 50 {
		relaytest.Insert(t, pool, want[i:i+50])
	}
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == int64(len(want))
	})
	relaytest.Check(t, want, readAll(t, brokers, topic), false)
}

// An unreachable broker is an outage: no attempt is counted, no row is
// parked, and the rows go out once the broker is back.
func TestRelayKafkaOutage(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers)
	pool, _, _ := relaytest.NewPool(t)
	want := relaytest.Messages("o", topic, 20, 3)
	relaytest.Insert(t, pool, want)

	// A publisher pointed at a closed port stands in for a broker that is down.
	down, err := kafkaoutbox.New(kafkaoutbox.Config{Brokers: []string{"127.0.0.1:1"}, WriteTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	r, err := outbox.NewRelay(pool, down, relaytest.FastConfig())
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := r.RelayOnce(context.Background()); !errors.Is(err, outbox.ErrUnavailable) {
			t.Fatalf("relay with the broker down: %v, want ErrUnavailable", err)
		}
	}
	var attempts int
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(max(attempts), 0) FROM idemq_outbox`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if c := relaytest.Counts(t, pool); attempts != 0 || c.Pending != int64(len(want)) {
		t.Fatalf("after an outage: counts %s, max attempts %d; want all pending, 0 attempts", fmtCounts(c), attempts)
	}
	relaytest.StartRelays(t, pool, newPublisher(t, brokers), 1, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == int64(len(want))
	})
	relaytest.Check(t, want, readAll(t, brokers, topic), false)
}

func fmtCounts(c outbox.Counts) string {
	return fmt.Sprintf("pending=%d sent=%d parked=%d", c.Pending, c.Sent, c.Parked)
}

// A message the broker refuses for good (larger than the broker's
// message.max.bytes, 1 MiB by default) is an attempt, not an outage, and
// fails as its element of the writer's per-message errors: it is not marked
// sent. The rows of other partitions go out in the same batch (those of its
// partition share its produce request and fail with it).
func TestRelayKafkaMessageTooLarge(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers)
	pool, _, _ := relaytest.NewPool(t)
	small := relaytest.Messages("s", topic, 12, 12)
	relaytest.Insert(t, pool, small)
	relaytest.Insert(t, pool, []outbox.Message{{ID: "big", Destination: topic, Key: "k-big", Body: make([]byte, 2<<20)}})
	r, err := outbox.NewRelay(pool, newPublisher(t, brokers), relaytest.FastConfig())
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RelayOnce(t.Context()); err != nil || n != len(small)+1 {
		t.Fatalf("RelayOnce = %d, %v; want %d rows and no outage", n, err, len(small)+1)
	}
	var state, attempts int
	var lastErr string
	if err := pool.QueryRow(t.Context(), `SELECT state, attempts, coalesce(last_error, '') FROM idemq_outbox WHERE id = 'big'`).Scan(&state, &attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if state != 0 || attempts != 1 {
		t.Fatalf("the refused message: state %d, attempts %d (%q); want pending (0) with 1 attempt, not sent", state, attempts, lastErr)
	}
	// Every row marked sent is in the topic, and some were (3 partitions).
	rows, err := pool.Query(t.Context(), `SELECT id FROM idemq_outbox WHERE state = 1 ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	sent, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	inTopic := map[string]bool{}
	for _, g := range readAll(t, brokers, topic) {
		inTopic[g.ID] = true
	}
	for _, id := range sent {
		if !inTopic[id] {
			t.Fatalf("row %s marked sent but not in the topic (sent %v)", id, sent)
		}
	}
	if len(sent) == 0 || len(inTopic) != len(sent) {
		t.Fatalf("%d rows marked sent, %d messages in the topic; want the same, more than 0", len(sent), len(inTopic))
	}
}
