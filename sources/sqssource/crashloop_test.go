package sqssource_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
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

// Environment of the crash-loop worker process.
const (
	crashEnv       = "IDEMQ_SQSSOURCE_CRASH_WORKER" // "block" or "fail-once" in the child
	crashQueueEnv  = "IDEMQ_SQSSOURCE_CRASH_QUEUE"
	crashDLQEnv    = "IDEMQ_SQSSOURCE_CRASH_DLQ"
	crashSchemaEnv = "IDEMQ_SQSSOURCE_CRASH_SCHEMA"
)

// crashMaxAttempts is the worker's Retry.MaxAttempts: fewer than the kills.
const crashMaxAttempts = 5

// TestCrashLoopWorker is the worker process of TestCrashLoopIsNotCounted. In
// mode "block" its handler announces the message and hangs until the parent
// kills the process; in mode "fail-once" its handler fails on its first call
// and records the effect on the next. It does nothing when run on its own.
func TestCrashLoopWorker(t *testing.T) {
	mode := os.Getenv(crashEnv)
	if mode == "" {
		t.Skip("helper process of TestCrashLoopIsNotCounted")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // never outlive the parent by much
	defer cancel()

	schema := os.Getenv(crashSchemaEnv)
	dbURL, err := testenv.WithSearchPath(testenv.DatabaseURL(t), schema)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
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
	defer src.Close()

	calls := 0
	handler := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		calls++
		fmt.Printf("CALL attempt=%d\n", msg.Attempt)
		switch {
		case mode == "block":
			fmt.Println("INFLIGHT")
			<-ctx.Done() // the parent kills the process meanwhile
			return ctx.Err()
		case calls == 1:
			fmt.Println("FAILED")
			return errors.New("downstream refused")
		}
		return recordEffect("final")(ctx, tx, msg)
	}
	r, err := consumer.NewRunner(src, consumer.Transactional(store, handler), consumer.Config{
		Name: "crashloop", Concurrency: 1,
		HandlerTimeout: time.Minute,
		Retry:          consumer.RetryPolicy{MaxAttempts: crashMaxAttempts, InitialBackoff: time.Second, MaxBackoff: time.Second, Jitter: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("READY")
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	st := r.Stats()
	fmt.Printf("STATS handled=%d retried=%d deadlettered=%d\n", st.Handled, st.Retried, st.DeadLettered)
}

// startCrashWorker starts a TestCrashLoopWorker process in mode.
func startCrashWorker(t *testing.T, mode string, q testQueue, db database) *runtest.Child {
	t.Helper()
	return runtest.StartChild(t, "TestCrashLoopWorker", []string{
		crashEnv + "=" + mode,
		crashQueueEnv + "=" + q.URL,
		crashDLQEnv + "=" + q.DLQURL,
		crashSchemaEnv + "=" + db.Schema,
		testenv.EnvSQSEndpoint + "=" + testenv.SQSEndpoint(t),
		testenv.EnvDatabaseURL + "=" + testenv.DatabaseURL(t),
	})
}

// crashAttempt parses a worker's "CALL attempt=N" line.
func crashAttempt(t *testing.T, line string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscanf(line, "CALL attempt=%d", &n); err != nil {
		t.Fatalf("worker line %q: %v", line, err)
	}
	return n
}

// The acceptance test of "attempts count handler failures": a worker process
// is SIGKILLed ten times while the message is in flight (each kill raises
// ApproximateReceiveCount), then the handler fails once and succeeds on its
// retry. With Retry.MaxAttempts 5 the message must not be dead-lettered: one
// handler failure is one attempt, whatever the receive count.
func TestCrashLoopIsNotCounted(t *testing.T) {
	t.Parallel()
	const kills = 10
	q := newQueue(t, queueOptions{})
	db := newDatabase(t)
	publish(t, q.URL, false, outMsg{Key: "crash-1", Body: `{"n":1}`})

	// Each kill raises the receive count by at least one (by more when a
	// receive of the killed process was in flight).
	last := 0
	for i := 1; i <= kills; i++ {
		w := startCrashWorker(t, "block", q, db)
		attempt := crashAttempt(t, w.Expect(t, "CALL ", 60*time.Second))
		w.Expect(t, "INFLIGHT", 10*time.Second)
		if attempt <= last {
			t.Fatalf("kill %d: attempt %d after attempt %d; each kill must raise the receive count", i, attempt, last)
		}
		last = attempt
		w.Kill()
		if !w.Killed() {
			t.Fatalf("kill %d: worker exited otherwise: %v", i, w.Err())
		}
	}

	w := startCrashWorker(t, "fail-once", q, db)
	attempt := crashAttempt(t, w.Expect(t, "CALL ", 60*time.Second))
	if attempt <= kills || attempt < crashMaxAttempts {
		t.Fatalf("after %d kills the handler failed at attempt %d, want more than %d", kills, attempt, kills)
	}
	w.Expect(t, "FAILED", 10*time.Second)
	t.Logf("the handler failed once at receive count %d after %d SIGKILLs", attempt, kills)
	runtest.WaitFor(t, 60*time.Second, func() string {
		rows, _ := effectCounts(t, db)
		return fmt.Sprintf("%d effects, queue depth %d, dead letters %d; worker output:\n%s",
			rows, queueDepth(t, q.URL), queueDepth(t, q.DLQURL), w.Output())
	}, func() bool {
		rows, _ := effectCounts(t, db)
		return (rows == 1 && queueDepth(t, q.URL) == 0) || queueDepth(t, q.DLQURL) > 0
	})
	if err := syscall.Kill(w.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stats := w.Expect(t, "STATS ", 30*time.Second)
	rows, _ := effectCounts(t, db)
	if dl := queueDepth(t, q.DLQURL); dl != 0 || rows != 1 {
		t.Fatalf("after %d kills and 1 handler failure at MaxAttempts %d: %d dead letters and %d effects, want 0 and 1 (%s)\n%s",
			kills, crashMaxAttempts, dl, rows, stats, w.Output())
	}
	if stats != "STATS handled=1 retried=1 deadlettered=0" {
		t.Fatalf("worker stats %q, want one retry and one handled message", stats)
	}
	var failures int
	if err := db.Pool.QueryRow(testContext(t, 10*time.Second),
		`SELECT failures FROM processed_messages_failures WHERE scope = 'crashloop' AND key = 'crash-1'`).Scan(&failures); err != nil || failures != 1 {
		t.Fatalf("recorded failures = %d, %v; want 1", failures, err)
	}
}
