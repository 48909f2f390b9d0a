package sqssource_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sqssource"
)

// Environment of the helper worker process.
const (
	helperEnv         = "IDEMQ_SQSSOURCE_HELPER" // "1" in the child
	helperQueueEnv    = "IDEMQ_SQSSOURCE_HELPER_QUEUE"
	helperDLQEnv      = "IDEMQ_SQSSOURCE_HELPER_DLQ"
	helperSchemaEnv   = "IDEMQ_SQSSOURCE_HELPER_SCHEMA"
	helperWorkerEnv   = "IDEMQ_SQSSOURCE_HELPER_WORKER"
	helperBlockEnv    = "IDEMQ_SQSSOURCE_HELPER_BLOCK_AFTER" // acked messages after which Ack blocks
	helperHandlerTime = 20 * time.Millisecond
)

// TestHelperWorker is the worker process of TestProcessKill: it runs a runner
// over an SQS source until SIGTERM, recording one effect row per message. It
// does nothing when run on its own.
func TestHelperWorker(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process of TestProcessKill")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // never outlive the parent by much
	defer cancel()
	worker := os.Getenv(helperWorkerEnv)

	dbURL, err := testenv.WithSearchPath(testenv.DatabaseURL(t), os.Getenv(helperSchemaEnv))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: os.Getenv(helperSchemaEnv)})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sqssource.New(ctx, sqsClient(t), sqssource.Config{
		QueueURL:           os.Getenv(helperQueueEnv),
		DeadLetterQueueURL: os.Getenv(helperDLQEnv),
		KeyAttribute:       keyAttribute,
		VisibilityTimeout:  2 * time.Second,
		WaitTime:           time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	handler := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		if err := recordEffect(worker)(ctx, tx, msg); err != nil {
			return err
		}
		time.Sleep(helperHandlerTime)
		return nil
	}
	blockAfter, _ := strconv.Atoi(os.Getenv(helperBlockEnv))
	r, err := consumer.NewRunner(&blockingAck{Source: src, after: int64(blockAfter)}, consumer.Transactional(store, handler),
		consumer.Config{Name: "kill", Concurrency: 2, BatchSize: 5, Retry: fastRetry})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("READY")
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	st := r.Stats()
	fmt.Printf("STATS handled=%d duplicates=%d\n", st.Handled, st.Duplicates)
}

// blockingAck stops the worker right after a commit: once after messages were
// acknowledged, the next Ack prints BLOCKED and never deletes, so that a kill
// then hits committed messages that are not deleted.
type blockingAck struct {
	consumer.Source
	after int64
	acked atomic.Int64
}

func (b *blockingAck) Ack(ctx context.Context, msgs []*consumer.Message) error {
	if b.after > 0 && b.acked.Add(int64(len(msgs))) > b.after {
		fmt.Printf("BLOCKED %d\n", len(msgs))
		<-ctx.Done()
		return ctx.Err()
	}
	return b.Source.Ack(ctx, msgs)
}

// TestProcessKill runs a worker as a child process, kills it with SIGKILL in
// the middle of the stream, starts a new one, and checks that every message's
// effect was applied exactly once.
func TestProcessKill(t *testing.T) {
	t.Parallel()
	const n = 300
	q := newQueue(t, queueOptions{})
	db := newDatabase(t)
	publish(t, q.URL, false, numbered("kill", n)...)

	start := func(worker string, blockAfter int) *runtest.Child {
		return runtest.StartChild(t, "TestHelperWorker", []string{
			helperEnv + "=1",
			helperQueueEnv + "=" + q.URL,
			helperDLQEnv + "=" + q.DLQURL,
			helperSchemaEnv + "=" + db.Schema,
			helperWorkerEnv + "=" + worker,
			helperBlockEnv + "=" + strconv.Itoa(blockAfter),
			testenv.EnvSQSEndpoint + "=" + testenv.SQSEndpoint(t),
			testenv.EnvDatabaseURL + "=" + testenv.DatabaseURL(t),
		})
	}
	exited := func(c *runtest.Child, timeout time.Duration) bool {
		select {
		case <-c.Done():
			return true
		case <-time.After(timeout):
			return false
		}
	}
	rows := func() int { r, _ := effectCounts(t, db); return r }

	// Worker 1 stops deleting after a quarter of the messages, right after a
	// commit, and is killed there, while its other lane is anywhere.
	w1 := start("w1", n/4)
	runtest.WaitFor(t, 60*time.Second, func() string { return fmt.Sprintf("%d rows; worker output:\n%s", rows(), w1.Output()) },
		func() bool { return strings.Contains(w1.Output(), "BLOCKED") })
	w1.Kill()
	atKill := rows()
	if atKill >= n {
		t.Fatalf("the worker finished all %d messages before it was killed; the test proves nothing", n)
	}

	w2 := start("w2", 0)
	runtest.WaitFor(t, 90*time.Second, func() string {
		return fmt.Sprintf("%d rows, queue depth %d; worker output:\n%s", rows(), queueDepth(t, q.URL), w2.Output())
	}, func() bool {
		_, keys := effectCounts(t, db)
		return keys >= n && queueDepth(t, q.URL) == 0
	})
	if err := syscall.Kill(w2.Pid(), syscall.SIGTERM); err != nil {
		t.Fatalf("stop worker 2: %v", err)
	}
	if !exited(w2, 30*time.Second) {
		t.Fatalf("worker 2 did not stop on SIGTERM:\n%s", w2.Output())
	}

	total, keys := effectCounts(t, db)
	stats := lastLine(w2.Output(), "STATS")
	t.Logf("killed worker 1 after %d effects; worker 2: %s", atKill, stats)
	if total != n || keys != n {
		t.Fatalf("%d effect rows for %d distinct keys, want exactly %d each", total, keys, n)
	}
	var handled, duplicates int
	if _, err := fmt.Sscanf(stats, "STATS handled=%d duplicates=%d", &handled, &duplicates); err != nil {
		t.Fatalf("worker 2 printed no stats (%v):\n%s", err, w2.Output())
	}
	if duplicates < 1 || handled+atKill != n {
		t.Fatalf("worker 2 handled %d and deduplicated %d after %d effects of worker 1; want at least the blocked batch deduplicated and %d handled in all",
			handled, duplicates, atKill, n)
	}
}

// lastLine returns the last line of s that starts with prefix.
func lastLine(s, prefix string) string {
	var last string
	for _, l := range bytes.Split([]byte(s), []byte("\n")) {
		if bytes.HasPrefix(l, []byte(prefix)) {
			last = string(l)
		}
	}
	return last
}
