package sqssource_test

import (
	"context"
	"testing"
	"time"
)

// BenchmarkReceiveAck measures the source alone: b.N messages received and
// deleted through Receive and Ack, 40 at a time, with no handler. Publishing
// is not timed. For the comparison with the raw API and with the runner on
// PostgreSQL, run `go -C cmd/internal run ./bench/sqs`.
func BenchmarkReceiveAck(b *testing.B) {
	q := newQueue(b, queueOptions{})
	publish(b, q.URL, false, numbered("bench", b.N)...)
	cfg := sourceConfig(b, q)
	cfg.VisibilityTimeout = 30 * time.Second
	src := newSource(b, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	b.ResetTimer()
	for done := 0; done < b.N; {
		msgs, err := src.Receive(ctx, 40)
		if err != nil {
			b.Fatalf("Receive after %d: %v", done, err)
		}
		if err := src.Ack(ctx, msgs); err != nil {
			b.Fatalf("Ack: %v", err)
		}
		done += len(msgs)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
