package sqssource_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sourcetest"
	"github.com/idemq/idemq/sources/sqssource"
)

// Environment of the crash-loop worker process.
const (
	crashEnv       = "IDEMQ_SQSSOURCE_CRASH_WORKER" // the sourcetest.CrashLoop mode in the child
	crashQueueEnv  = "IDEMQ_SQSSOURCE_CRASH_QUEUE"
	crashDLQEnv    = "IDEMQ_SQSSOURCE_CRASH_DLQ"
	crashSchemaEnv = "IDEMQ_SQSSOURCE_CRASH_SCHEMA"
)

// TestCrashLoopWorker is the worker process of TestCrashLoopIsNotCounted
// (sourcetest.CrashLoopWorker over a source with a one-second visibility
// timeout, retrying after a second). It does nothing when run on its own.
func TestCrashLoopWorker(t *testing.T) {
	mode := os.Getenv(crashEnv)
	if mode == "" {
		t.Skip("helper process of TestCrashLoopIsNotCounted")
	}
	sourcetest.CrashLoopWorker(t, mode, func(ctx context.Context) (consumer.Source, dedupdriver.TxStore[pgx.Tx]) {
		schema := os.Getenv(crashSchemaEnv)
		dbURL, err := testenv.WithSearchPath(testenv.DatabaseURL(t), schema)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		src, err := sqssource.New(ctx, sqsClient(t), sqssource.Config{
			QueueURL:           os.Getenv(crashQueueEnv),
			DeadLetterQueueURL: os.Getenv(crashDLQEnv),
			KeyAttribute:       keyAttribute,
			VisibilityTimeout:  time.Second,
			WaitTime:           time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close() })
		return src, store
	}, recordEffect("final"), time.Second)
}

// The acceptance test of "attempts count handler failures" on SQS
// (sourcetest.RunCrashLoop): each kill raises ApproximateReceiveCount by at
// least one (by more when a receive of the killed process was in flight).
func TestCrashLoopIsNotCounted(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	db := newDatabase(t)
	publish(t, q.URL, false, outMsg{Key: sourcetest.CrashLoopKey, Body: `{"n":1}`})

	effects := func(t *testing.T) int { rows, _ := effectCounts(t, db); return rows }
	sourcetest.RunCrashLoop(t, sourcetest.CrashLoop{
		Start: func(t *testing.T, mode string) *runtest.Child {
			return runtest.StartChild(t, "TestCrashLoopWorker", []string{
				crashEnv + "=" + mode,
				crashQueueEnv + "=" + q.URL,
				crashDLQEnv + "=" + q.DLQURL,
				crashSchemaEnv + "=" + db.Schema,
				testenv.EnvSQSEndpoint + "=" + testenv.SQSEndpoint(t),
				testenv.EnvDatabaseURL + "=" + testenv.DatabaseURL(t),
			})
		},
		Settled: func(t *testing.T) bool {
			return (effects(t) == 1 && queueDepth(t, q.URL) == 0) || queueDepth(t, q.DLQURL) > 0
		},
		Effects:     effects,
		DeadLetters: func(t *testing.T) int { return queueDepth(t, q.DLQURL) },
		Failures: func(t *testing.T) (int, error) {
			var failures int
			err := db.Pool.QueryRow(testContext(t, 10*time.Second),
				`SELECT failures FROM processed_messages_failures WHERE scope = $1 AND key = $2`,
				sourcetest.CrashLoopName, sourcetest.CrashLoopKey).Scan(&failures)
			return failures, err
		},
		Count:   "receive count",
		Timeout: 60 * time.Second,
	})
}
