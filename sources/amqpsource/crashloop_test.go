package amqpsource_test

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

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// Environment of the crash-loop worker process.
const (
	crashEnv       = "IDEMQ_AMQPSOURCE_CRASH_WORKER" // "block" or "fail-once" in the child
	crashAMQPEnv   = "IDEMQ_AMQPSOURCE_CRASH_AMQP"
	crashQueueEnv  = "IDEMQ_AMQPSOURCE_CRASH_QUEUE"
	crashDBEnv     = "IDEMQ_AMQPSOURCE_CRASH_DB"
	crashSchemaEnv = "IDEMQ_AMQPSOURCE_CRASH_SCHEMA"
)

// crashMaxAttempts is the worker's Retry.MaxAttempts: fewer than the kills.
const crashMaxAttempts = 5

// crashDeliveryLimit is the quorum queue's x-delivery-limit in the crash-loop
// test: far above the kills, so that the broker never dead-letters by itself
// and only the runner's decision is tested.
const crashDeliveryLimit = 1000

// TestCrashLoopWorker is the worker process of TestCrashLoopIsNotCounted. In
// mode "block" its handler announces the message and hangs until the parent
// kills the process; in mode "fail-once" its handler fails on its first call
// and applies the effect on the next. It does nothing when run on its own.
func TestCrashLoopWorker(t *testing.T) {
	mode := os.Getenv(crashEnv)
	if mode == "" {
		t.Skip("helper process of TestCrashLoopIsNotCounted")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // never outlive the parent by much
	defer cancel()

	db := openDatabase(t, os.Getenv(crashDBEnv), os.Getenv(crashSchemaEnv))
	src, err := amqpsource.New(ctx, amqpsource.Config{URL: os.Getenv(crashAMQPEnv), Queue: os.Getenv(crashQueueEnv), Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	calls := 0
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		calls++
		fmt.Printf("CALL attempt=%d\n", m.Attempt)
		switch {
		case mode == "block":
			fmt.Println("INFLIGHT")
			<-ctx.Done() // the parent kills the process meanwhile
			return ctx.Err()
		case calls == 1:
			fmt.Println("FAILED")
			return errors.New("downstream refused")
		}
		return apply(ctx, tx, m.Key)
	}
	r, err := consumer.NewRunner(src, consumer.Transactional(db.store, handler), consumer.Config{
		Name: "crashloop", Concurrency: 1,
		HandlerTimeout: time.Minute,
		Retry:          consumer.RetryPolicy{MaxAttempts: crashMaxAttempts, InitialBackoff: 200 * time.Millisecond, MaxBackoff: time.Second, Jitter: -1},
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
func startCrashWorker(t *testing.T, mode, url, queue string, db *database) *runtest.Child {
	t.Helper()
	return runtest.StartChild(t, "TestCrashLoopWorker", []string{
		crashEnv + "=" + mode,
		crashAMQPEnv + "=" + url,
		crashQueueEnv + "=" + queue,
		crashDBEnv + "=" + db.url,
		crashSchemaEnv + "=" + db.schema,
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

// The acceptance test of "attempts count handler failures" on a quorum
// queue: a worker process is SIGKILLed ten times while the message is in
// flight (each kill returns the delivery unsettled and raises
// x-delivery-count), then the handler fails once and succeeds on its retry.
// With Retry.MaxAttempts 5 the message must not be dead-lettered: one
// handler failure is one attempt, whatever the delivery count.
func TestCrashLoopIsNotCounted(t *testing.T) {
	t.Parallel()
	const kills = 10
	url := brokerURL(t)
	q := newQueue(t, url, quorum, crashDeliveryLimit)
	db := newDatabase(t)
	publish(t, url, q, sourcetest.Outgoing{Key: "crash-1", Body: []byte(`{"n":1}`)})

	last := 0
	for i := 1; i <= kills; i++ {
		w := startCrashWorker(t, "block", url, q, db)
		attempt := crashAttempt(t, w.Expect(t, "CALL ", testTimeout))
		w.Expect(t, "INFLIGHT", testTimeout)
		if attempt <= last {
			t.Fatalf("kill %d: attempt %d after attempt %d; each kill must raise the delivery count", i, attempt, last)
		}
		last = attempt
		w.Kill()
		if !w.Killed() {
			t.Fatalf("kill %d: worker exited otherwise: %v", i, w.Err())
		}
	}

	w := startCrashWorker(t, "fail-once", url, q, db)
	attempt := crashAttempt(t, w.Expect(t, "CALL ", testTimeout))
	if attempt <= kills {
		t.Fatalf("after %d kills the handler failed at attempt %d, want more than %d", kills, attempt, kills)
	}
	w.Expect(t, "FAILED", testTimeout)
	t.Logf("the handler failed once at delivery attempt %d after %d SIGKILLs", attempt, kills)
	// The retry comes back after 200 ms (InitialBackoff).
	runtest.WaitFor(t, backTimeout, runtest.Say("the effect or a dead letter"), func() bool {
		return db.effects(t)["crash-1"] > 0 || queueDepth(t, url, q+".dlq") > 0
	})
	if err := syscall.Kill(w.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stats := w.Expect(t, "STATS ", testTimeout)
	if dl, n := queueDepth(t, url, q+".dlq"), db.effects(t)["crash-1"]; dl != 0 || n != 1 {
		t.Fatalf("after %d kills and 1 handler failure at MaxAttempts %d: %d dead letters and %d effects, want 0 and 1 (%s)\n%s",
			kills, crashMaxAttempts, dl, n, stats, w.Output())
	}
	if stats != "STATS handled=1 retried=1 deadlettered=0" {
		t.Fatalf("worker stats %q, want one retry and one handled message", stats)
	}
	var failures int
	if err := db.pool.QueryRow(context.Background(),
		`SELECT failures FROM processed_messages_failures WHERE scope = 'crashloop' AND key = 'crash-1'`).Scan(&failures); err != nil || failures != 1 {
		t.Fatalf("recorded failures = %d, %v; want 1", failures, err)
	}
}
