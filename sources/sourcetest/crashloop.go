package sourcetest

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/internal/runtest"
)

// The crash-loop scenario's fixed names: the one message's key, the worker's
// Config.Name (the failures' scope), its Retry.MaxAttempts (fewer than the
// kills) and the number of kills.
const (
	CrashLoopKey         = "crash-1"
	CrashLoopName        = "crashloop"
	CrashLoopMaxAttempts = 5
	crashLoopKills       = 10
)

// Modes of a crash-loop worker process.
const (
	// CrashLoopBlock: the handler announces the message and hangs until the
	// parent kills the process.
	CrashLoopBlock = "block"
	// CrashLoopFailOnce: the handler fails on its first call and applies the
	// effect on the next.
	CrashLoopFailOnce = "fail-once"
)

// CrashLoop is what RunCrashLoop needs of an adapter: how to start its
// worker process and how to observe the broker and the database. Every
// field is required.
type CrashLoop struct {
	// Start starts a worker process in mode (CrashLoopBlock or
	// CrashLoopFailOnce): a test of the adapter's package that calls
	// CrashLoopWorker on the queue holding the one message CrashLoopKey.
	Start func(t *testing.T, mode string) *runtest.Child
	// Settled reports whether the message is done with: its effect applied
	// and acknowledged, or dead-lettered.
	Settled func(t *testing.T) bool
	// Effects is the number of effects applied for the message.
	Effects func(t *testing.T) int
	// DeadLetters is the number of dead letters.
	DeadLetters func(t *testing.T) int
	// Failures is the handler failure count recorded for CrashLoopKey in
	// scope CrashLoopName.
	Failures func(t *testing.T) (int, error)
	// Count names the broker's delivery count ("delivery count",
	// "receive count") in failure messages.
	Count string
	// Timeout bounds each wait for the worker or the broker.
	Timeout time.Duration
}

// RunCrashLoop is the acceptance test of "attempts count handler failures":
// a worker process is SIGKILLed ten times while the one message is in
// flight (each kill raises the broker's delivery count), then the handler
// fails once and succeeds on its retry. With Retry.MaxAttempts 5 the message
// must not be dead-lettered: one handler failure is one attempt, whatever the
// delivery count. The adapter publishes the message before calling it.
func RunCrashLoop(t *testing.T, c CrashLoop) {
	t.Helper()
	last := 0
	for i := 1; i <= crashLoopKills; i++ {
		w := c.Start(t, CrashLoopBlock)
		attempt := crashAttempt(t, w.Expect(t, "CALL ", c.Timeout))
		w.Expect(t, "INFLIGHT", c.Timeout)
		if attempt <= last {
			t.Fatalf("kill %d: attempt %d after attempt %d; each kill must raise the %s", i, attempt, last, c.Count)
		}
		last = attempt
		w.Kill()
		if !w.Killed() {
			t.Fatalf("kill %d: worker exited otherwise: %v", i, w.Err())
		}
	}

	w := c.Start(t, CrashLoopFailOnce)
	attempt := crashAttempt(t, w.Expect(t, "CALL ", c.Timeout))
	if attempt <= crashLoopKills {
		t.Fatalf("after %d kills the handler failed at attempt %d, want more than %d", crashLoopKills, attempt, crashLoopKills)
	}
	w.Expect(t, "FAILED", c.Timeout)
	t.Logf("the handler failed once at %s %d after %d SIGKILLs", c.Count, attempt, crashLoopKills)
	runtest.WaitFor(t, c.Timeout, func() string {
		return fmt.Sprintf("the effect or a dead letter: %d effects, %d dead letters; worker output:\n%s",
			c.Effects(t), c.DeadLetters(t), w.Output())
	}, func() bool { return c.Settled(t) })
	if err := syscall.Kill(w.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stats := w.Expect(t, "STATS ", c.Timeout)
	if dl, n := c.DeadLetters(t), c.Effects(t); dl != 0 || n != 1 {
		t.Fatalf("after %d kills and 1 handler failure at MaxAttempts %d: %d dead letters and %d effects, want 0 and 1 (%s)\n%s",
			crashLoopKills, CrashLoopMaxAttempts, dl, n, stats, w.Output())
	}
	if stats != "STATS handled=1 retried=1 deadlettered=0" {
		t.Fatalf("worker stats %q, want one retry and one handled message", stats)
	}
	if failures, err := c.Failures(t); err != nil || failures != 1 {
		t.Fatalf("recorded failures = %d, %v; want 1", failures, err)
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

// CrashLoopWorker is the body of RunCrashLoop's worker process: it opens
// the source and the store with open (which registers their closing with
// t.Cleanup) and runs a Runner named CrashLoopName over them with
// Concurrency 1, Retry.MaxAttempts CrashLoopMaxAttempts and backoff as its
// first retry delay, until SIGTERM (or two minutes), printing what the parent
// waits for. In mode CrashLoopBlock the handler hangs; in mode
// CrashLoopFailOnce it fails its first call and then calls apply.
func CrashLoopWorker[Tx any](t *testing.T, mode string, open func(ctx context.Context) (consumer.Source, dedupdriver.TxStore[Tx]), apply consumer.TxHandler[Tx], backoff time.Duration) {
	t.Helper()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // never outlive the parent by much
	defer cancel()
	src, store := open(ctx)

	calls := 0
	handler := func(ctx context.Context, tx Tx, m *consumer.Message) error {
		calls++
		fmt.Printf("CALL attempt=%d\n", m.Attempt)
		switch {
		case mode == CrashLoopBlock:
			fmt.Println("INFLIGHT")
			<-ctx.Done() // the parent kills the process meanwhile
			return ctx.Err()
		case calls == 1:
			fmt.Println("FAILED")
			return errors.New("downstream refused")
		}
		return apply(ctx, tx, m)
	}
	r, err := consumer.NewRunner(src, consumer.Transactional(store, handler), consumer.Config{
		Name: CrashLoopName, Concurrency: 1,
		HandlerTimeout: time.Minute,
		Retry:          consumer.RetryPolicy{MaxAttempts: CrashLoopMaxAttempts, InitialBackoff: backoff, MaxBackoff: time.Second, Jitter: -1},
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
