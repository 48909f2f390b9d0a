package kafkasource_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sourcetest"
)

// benchTopic publishes n messages with keys and key headers to a fresh
// 8-partition topic.
func benchTopic(b *testing.B, brokers []string, n int) string {
	b.Helper()
	topic := newTopic(b, brokers, 8)
	const chunk = 5000
	out := make([]sourcetest.Outgoing, 0, chunk)
	for i := 0; i < n; i++ {
		out = append(out, sourcetest.Outgoing{Key: "k" + strconv.Itoa(i), Body: []byte(`{"n":1}`), PartitionKey: "p" + strconv.Itoa(i%1000)})
		if len(out) == chunk || i == n-1 {
			publish(b, brokers, topic, out...)
			out = out[:0]
		}
	}
	return topic
}

// BenchmarkSourceReceiveAck measures Receive and Ack (with its synchronous
// commit) of b.N messages, 100 at a time, with no handler. Run it with a fixed
// count, for example -benchtime=100000x, so that the group join is amortised.
func BenchmarkSourceReceiveAck(b *testing.B) {
	skipShort(b)
	brokers := testenv.KafkaBrokers(b)
	topic := benchTopic(b, brokers, b.N)
	src := openSource(b, testConfig(b, brokers, topic, runtest.UniqueName(b, "g")))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.ResetTimer()
	for got := 0; got < b.N; {
		msgs, err := src.Receive(ctx, 100)
		if err != nil {
			if ctx.Err() != nil {
				b.Fatal(err)
			}
			b.Logf("Receive: %v", err) // transient fetch error
			continue
		}
		if err := src.Ack(ctx, msgs); err != nil {
			b.Fatal(err)
		}
		got += len(msgs)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkRawKafkaGo is the baseline of BenchmarkSourceReceiveAck: a plain
// kafka-go group reader, FetchMessage and a synchronous CommitMessages every
// 100 messages.
func BenchmarkRawKafkaGo(b *testing.B) {
	skipShort(b)
	brokers := testenv.KafkaBrokers(b)
	topic := benchTopic(b, brokers, b.N)
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: runtest.UniqueName(b, "g"), Topic: topic, MaxWait: 250 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.ResetTimer()
	pending := make([]kafka.Message, 0, 100)
	for i := 0; i < b.N; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if pending = append(pending, m); len(pending) == 100 || i == b.N-1 {
			if err := r.CommitMessages(ctx, pending...); err != nil {
				b.Fatal(err)
			}
			pending = pending[:0]
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
