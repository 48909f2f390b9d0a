package runtest

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Logger returns the logger of idemq's own tests: with IDEMQ_TEST_LOG=1 it
// writes everything from Debug up to stderr; otherwise it writes warnings
// and errors to t's log until t ends, and drops what a background
// goroutine (a broker client's, say) logs after that, which t.Log forbids.
func Logger(t testing.TB) *slog.Logger {
	if os.Getenv("IDEMQ_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// testWriter writes to t.Log until the test ends, then drops.
type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// WaitFor polls cond every 50 ms until it holds, and fails t with what()
// (the state worth seeing, computed when the wait has failed) if it does
// not within timeout.
func WaitFor(t testing.TB, timeout time.Duration, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not done within %s: %s", timeout, what())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Say returns a what for WaitFor that is a fixed text.
func Say(text string) func() string { return func() string { return text } }

// UniqueName returns a lowercase name made of prefix (if any), the end of
// t's name and a random suffix, of at most 64 characters from [a-z0-9-]:
// usable as a Kafka topic or group, an SQS queue (with room for ".fifo"), a
// RabbitMQ queue or a PostgreSQL identifier once quoted.
func UniqueName(t testing.TB, prefix string) string {
	base := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, t.Name())
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	name := strings.Trim(base, "-") + "-" + strings.ToLower(rand.Text()[:10])
	if prefix != "" {
		name = prefix + "-" + name
	}
	return name
}

// Receiver is the receiving half of a consumer.Source, over its message
// type M (*consumer.Message).
type Receiver[M any] interface {
	Receive(ctx context.Context, max int) ([]M, error)
}

// ExpectNothing fails t if src (a consumer.Source) hands out a message
// within window.
func ExpectNothing[M any](t testing.TB, src Receiver[M], window time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	msgs, err := src.Receive(ctx, 10)
	if err == nil {
		t.Fatalf("expected no message within %s, got %d (first %+v)", window, len(msgs), msgs[0])
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive: %v", err)
	}
}

// Start runs r in the background until the returned stop is called or t
// ends. stop cancels Run, waits for it to return (at most Timeout) and fails
// t on its error; it may be called more than once.
func Start(t testing.TB, r Runner) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Runner.Run: %v", err)
				}
			case <-time.After(Timeout):
				t.Errorf("Runner.Run did not return within %s of cancellation", Timeout)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
