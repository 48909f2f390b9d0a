package amqpsource_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
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

// crashWorker is a running TestCrashLoopWorker process.
type crashWorker struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}

	mu  sync.Mutex
	out strings.Builder
}

func (w *crashWorker) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.Write(p)
}

func (w *crashWorker) output() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()
}

func startCrashWorker(t *testing.T, mode, url, queue string, db *database) *crashWorker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashLoopWorker$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(),
		crashEnv+"="+mode,
		crashAMQPEnv+"="+url,
		crashQueueEnv+"="+queue,
		crashDBEnv+"="+db.url,
		crashSchemaEnv+"="+db.schema,
	)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w := &crashWorker{cmd: cmd, lines: make(chan string, 1000), done: make(chan struct{})}
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatalf("start worker: %v", err)
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(w, sc.Text())
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
func (w *crashWorker) expect(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(testTimeout)
	for {
		select {
		case l := <-w.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-w.done:
			t.Fatalf("worker exited before printing %q:\n%s", prefix, w.output())
		case <-deadline:
			t.Fatalf("worker did not print %q within %s:\n%s", prefix, testTimeout, w.output())
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
		attempt := crashAttempt(t, w.expect(t, "CALL "))
		w.expect(t, "INFLIGHT")
		if attempt <= last {
			t.Fatalf("kill %d: attempt %d after attempt %d; each kill must raise the delivery count", i, attempt, last)
		}
		last = attempt
		if err := syscall.Kill(w.cmd.Process.Pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: %v", i, err)
		}
		<-w.done
	}

	w := startCrashWorker(t, "fail-once", url, q, db)
	attempt := crashAttempt(t, w.expect(t, "CALL "))
	if attempt <= kills {
		t.Fatalf("after %d kills the handler failed at attempt %d, want more than %d", kills, attempt, kills)
	}
	w.expect(t, "FAILED")
	t.Logf("the handler failed once at delivery attempt %d after %d SIGKILLs", attempt, kills)
	// The retry comes back after 200 ms (InitialBackoff).
	runtest.WaitFor(t, backTimeout, runtest.Say("the effect or a dead letter"), func() bool {
		return db.effects(t)["crash-1"] > 0 || queueDepth(t, url, q+".dlq") > 0
	})
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stats := w.expect(t, "STATS ")
	if dl, n := queueDepth(t, url, q+".dlq"), db.effects(t)["crash-1"]; dl != 0 || n != 1 {
		t.Fatalf("after %d kills and 1 handler failure at MaxAttempts %d: %d dead letters and %d effects, want 0 and 1 (%s)\n%s",
			kills, crashMaxAttempts, dl, n, stats, w.output())
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
