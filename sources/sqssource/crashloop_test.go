package sqssource_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
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

// crashWorker is a running TestCrashLoopWorker process.
type crashWorker struct {
	cmd   *exec.Cmd
	lines chan string
	out   *runtest.SyncBuffer
	done  chan struct{}
}

func startCrashWorker(t *testing.T, mode string, q testQueue, db database) *crashWorker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashLoopWorker$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(),
		crashEnv+"="+mode,
		crashQueueEnv+"="+q.URL,
		crashDLQEnv+"="+q.DLQURL,
		crashSchemaEnv+"="+db.Schema,
		testenv.EnvSQSEndpoint+"="+testenv.SQSEndpoint(t),
		testenv.EnvDatabaseURL+"="+testenv.DatabaseURL(t),
	)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w := &crashWorker{cmd: cmd, lines: make(chan string, 1000), out: &runtest.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = w.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start worker: %v", err)
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(w.out, sc.Text())
			w.lines <- sc.Text()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-w.done
	})
	return w
}

// expect waits for a line starting with prefix and returns it.
func (w *crashWorker) expect(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-w.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-w.done:
			t.Fatalf("worker exited before printing %q:\n%s", prefix, w.out)
		case <-deadline:
			t.Fatalf("worker did not print %q within %s:\n%s", prefix, timeout, w.out)
		}
	}
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
		attempt := crashAttempt(t, w.expect(t, "CALL ", 60*time.Second))
		w.expect(t, "INFLIGHT", 10*time.Second)
		if attempt <= last {
			t.Fatalf("kill %d: attempt %d after attempt %d; each kill must raise the receive count", i, attempt, last)
		}
		last = attempt
		if err := syscall.Kill(w.cmd.Process.Pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: %v", i, err)
		}
		<-w.done
	}

	w := startCrashWorker(t, "fail-once", q, db)
	attempt := crashAttempt(t, w.expect(t, "CALL ", 60*time.Second))
	if attempt <= kills || attempt < crashMaxAttempts {
		t.Fatalf("after %d kills the handler failed at attempt %d, want more than %d", kills, attempt, kills)
	}
	w.expect(t, "FAILED", 10*time.Second)
	t.Logf("the handler failed once at receive count %d after %d SIGKILLs", attempt, kills)
	runtest.WaitFor(t, 60*time.Second, func() string {
		rows, _ := effectCounts(t, db)
		return fmt.Sprintf("%d effects, queue depth %d, dead letters %d; worker output:\n%s",
			rows, queueDepth(t, q.URL), queueDepth(t, q.DLQURL), w.out)
	}, func() bool {
		rows, _ := effectCounts(t, db)
		return (rows == 1 && queueDepth(t, q.URL) == 0) || queueDepth(t, q.DLQURL) > 0
	})
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stats := w.expect(t, "STATS ", 30*time.Second)
	rows, _ := effectCounts(t, db)
	if dl := queueDepth(t, q.DLQURL); dl != 0 || rows != 1 {
		t.Fatalf("after %d kills and 1 handler failure at MaxAttempts %d: %d dead letters and %d effects, want 0 and 1 (%s)\n%s",
			kills, crashMaxAttempts, dl, rows, stats, w.out)
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
