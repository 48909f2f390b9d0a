package amqpsource_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/amqpsource"
)

// The source reports the declared queue's message TTL, and the Runner
// refuses a dedup retention below it; a queue it declared without a TTL is
// unbounded, which the Runner runs without a warning (INFO); a queue it did
// not declare has an unknown TTL, which the Runner warns about.
func TestRetentionGuard(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	db := newDatabase(t)
	for _, tc := range []struct {
		name    string
		topo    *amqpsource.Topology
		horizon time.Duration
		unknown bool
		refused bool
		warned  bool
	}{
		{name: "ttl above retention", topo: &amqpsource.Topology{QueueArgs: amqp.Table{"x-message-ttl": int64((96 * time.Hour).Milliseconds())}}, horizon: 96 * time.Hour, refused: true},
		{name: "ttl below retention", topo: &amqpsource.Topology{QueueArgs: amqp.Table{"x-message-ttl": int64(time.Hour.Milliseconds())}}, horizon: time.Hour},
		{name: "MessageTTL above retention", topo: &amqpsource.Topology{MessageTTL: 96 * time.Hour}, horizon: 96 * time.Hour, refused: true},
		{name: "MessageTTL below retention", topo: &amqpsource.Topology{MessageTTL: time.Hour}, horizon: time.Hour},
		{name: "no ttl", topo: &amqpsource.Topology{}, horizon: consumer.Unbounded},
		{name: "declared by operations", unknown: true, warned: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := queueName(t)
			deleteQueuesAtCleanup(t, url, q)
			if tc.topo == nil {
				q = newQueue(t, url, classic, 0)
			}
			src := newSource(t, amqpsource.Config{URL: url, Queue: q, Declare: tc.topo})
			horizon, err := src.RedeliveryHorizon(context.Background())
			if tc.unknown {
				if !errors.Is(err, consumer.ErrHorizonUnknown) {
					t.Fatalf("RedeliveryHorizon = %v, %v; want consumer.ErrHorizonUnknown", horizon, err)
				}
			} else if err != nil || horizon != tc.horizon {
				t.Fatalf("RedeliveryHorizon = %v, %v; want %v", horizon, err, tc.horizon)
			}
			store, err := pgdedup.New(db.pool, pgdedup.Config{Schema: db.schema, Retention: 72 * time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			var logs runtest.SyncBuffer
			r, err := consumer.NewRunner(src, consumer.Transactional(store, func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
				consumer.Config{Name: "retention", Logger: slogTo(&logs)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			err = r.Run(ctx)
			cancel()
			if got := errors.Is(err, idemq.ErrInvalidConfig); got != tc.refused {
				t.Fatalf("Run = %v, want refused %v", err, tc.refused)
			}
			if warned := strings.Contains(logs.String(), "level=WARN"); warned != tc.warned {
				t.Errorf("warned %v, want %v: %q", warned, tc.warned, logs.String())
			}
			t.Logf("Run = %v; log %s", err, logs.String())
		})
	}
}

// slogTo returns a logger writing WARN and above to w.
func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// Topology.MessageTTL gives the declared queue its x-message-ttl: a message
// left in it longer expires into the dead-letter queue.
func TestTopologyMessageTTL(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := queueName(t)
	deleteQueuesAtCleanup(t, url, q)
	cfg := amqpsource.Config{URL: url, Queue: q, Declare: &amqpsource.Topology{QueueType: amqpsource.QueueTypeClassic, MessageTTL: 100 * time.Millisecond}}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	src, err := amqpsource.New(ctx, cfg) // declares, then consumes nothing
	if err != nil {
		t.Fatal(err)
	}
	_ = src.Close()
	publish(t, url, q, outgoing("ttl", 1)...)
	deadline := time.Now().Add(10 * time.Second)
	for queueDepth(t, url, amqpsource.DeadLetterQueue(cfg)) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: queue %d, dead-letter queue %d messages; want the message expired into the dead-letter queue",
				queueDepth(t, url, q), queueDepth(t, url, amqpsource.DeadLetterQueue(cfg)))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := queueDepth(t, url, q); n != 0 {
		t.Errorf("queue holds %d messages after the TTL, want 0", n)
	}
}
