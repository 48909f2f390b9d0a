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

// The source reports the declared queue's x-message-ttl, and the Runner
// refuses a dedup retention below it; a queue without a TTL is unbounded,
// which the Runner warns about and runs.
func TestRetentionGuard(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	db := newDatabase(t)
	for _, tc := range []struct {
		name    string
		args    amqp.Table
		horizon time.Duration
		refused bool
	}{
		{"ttl above retention", amqp.Table{"x-message-ttl": int64((96 * time.Hour).Milliseconds())}, 96 * time.Hour, true},
		{"ttl below retention", amqp.Table{"x-message-ttl": int64(time.Hour.Milliseconds())}, time.Hour, false},
		{"no ttl", nil, consumer.Unbounded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := queueName(t)
			deleteQueuesAtCleanup(t, url, q)
			src := newSource(t, amqpsource.Config{URL: url, Queue: q, Declare: &amqpsource.Topology{QueueArgs: tc.args}})
			horizon, err := src.RedeliveryHorizon(context.Background())
			if err != nil || horizon != tc.horizon {
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
			if tc.horizon == consumer.Unbounded && !strings.Contains(logs.String(), "x-message-ttl") {
				t.Errorf("no warning naming x-message-ttl for a queue without a TTL: %q", logs.String())
			}
			t.Logf("Run = %v; log %s", err, logs.String())
		})
	}
}

// slogTo returns a logger writing WARN and above to w.
func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
