package amqpsource_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// Environment of the crash-loop worker process.
const (
	crashEnv       = "IDEMQ_AMQPSOURCE_CRASH_WORKER" // the sourcetest.CrashLoop mode in the child
	crashAMQPEnv   = "IDEMQ_AMQPSOURCE_CRASH_AMQP"
	crashQueueEnv  = "IDEMQ_AMQPSOURCE_CRASH_QUEUE"
	crashDBEnv     = "IDEMQ_AMQPSOURCE_CRASH_DB"
	crashSchemaEnv = "IDEMQ_AMQPSOURCE_CRASH_SCHEMA"
)

// crashDeliveryLimit is the quorum queue's x-delivery-limit in the crash-loop
// test: far above the kills, so that the broker never dead-letters by itself
// and only the runner's decision is tested.
const crashDeliveryLimit = 1000

// TestCrashLoopWorker is the worker process of TestCrashLoopIsNotCounted
// (sourcetest.CrashLoopWorker over a Prefetch 1 source, retrying after 200
// ms). It does nothing when run on its own.
func TestCrashLoopWorker(t *testing.T) {
	mode := os.Getenv(crashEnv)
	if mode == "" {
		t.Skip("helper process of TestCrashLoopIsNotCounted")
	}
	sourcetest.CrashLoopWorker(t, mode, func(ctx context.Context) (consumer.Source, dedupdriver.TxStore[pgx.Tx]) {
		db := openDatabase(t, os.Getenv(crashDBEnv), os.Getenv(crashSchemaEnv))
		src, err := amqpsource.New(ctx, amqpsource.Config{URL: os.Getenv(crashAMQPEnv), Queue: os.Getenv(crashQueueEnv), Prefetch: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close() })
		return src, db.store
	}, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return apply(ctx, tx, m.Key)
	}, 200*time.Millisecond)
}

// The acceptance test of "attempts count handler failures" on a quorum
// queue (sourcetest.RunCrashLoop): each kill returns the delivery unsettled
// and raises x-delivery-count.
func TestCrashLoopIsNotCounted(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, quorum, crashDeliveryLimit)
	db := newDatabase(t)
	publish(t, url, q, sourcetest.Outgoing{Key: sourcetest.CrashLoopKey, Body: []byte(`{"n":1}`)})

	effects := func(t *testing.T) int { return db.effects(t)[sourcetest.CrashLoopKey] }
	deadLetters := func(t *testing.T) int { return queueDepth(t, url, q+".dlq") }
	sourcetest.RunCrashLoop(t, sourcetest.CrashLoop{
		Start: func(t *testing.T, mode string) *runtest.Child {
			return runtest.StartChild(t, "TestCrashLoopWorker", []string{
				crashEnv + "=" + mode,
				crashAMQPEnv + "=" + url,
				crashQueueEnv + "=" + q,
				crashDBEnv + "=" + db.url,
				crashSchemaEnv + "=" + db.schema,
			})
		},
		Settled:     func(t *testing.T) bool { return effects(t) > 0 || deadLetters(t) > 0 },
		Effects:     effects,
		DeadLetters: deadLetters,
		Failures: func(t *testing.T) (int, error) {
			var failures int
			err := db.pool.QueryRow(context.Background(),
				`SELECT failures FROM processed_messages_failures WHERE scope = $1 AND key = $2`,
				sourcetest.CrashLoopName, sourcetest.CrashLoopKey).Scan(&failures)
			return failures, err
		},
		Count:   "delivery count",
		Timeout: testTimeout,
	})
}
