package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// The in-memory rig of this package's tests: a memdedup store, a memsource
// broker, and Runners built over them. A test that only runs a handler
// over scripted messages with faults and counts its effects uses
// consumertest; the helpers here serve the tests that look inside the
// Runner (its hooks, stats, health, logs or a wrapped source).

// newRunner is consumer.NewRunner for a test: cfg.Name defaults to "test",
// and an error fails t.
func newRunner(t testing.TB, src consumer.Source, path consumer.Path, cfg consumer.Config) *consumer.Runner {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	r, err := consumer.NewRunner(src, path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// startRunner builds a Runner with newRunner and runs it in the background
// until stop is called or t ends (see runtest.Start).
func startRunner(t testing.TB, src consumer.Source, path consumer.Path, cfg consumer.Config) (r *consumer.Runner, stop func()) {
	t.Helper()
	r = newRunner(t, src, path, cfg)
	return r, runtest.Start(t, r)
}

// runIdle runs r until it has been idle for idle (see Runner.WaitIdle),
// failing t if that takes more than runtest.Timeout or Run fails.
func runIdle(t testing.TB, r *consumer.Runner, idle time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runtest.Timeout)
	defer cancel()
	go func() {
		if r.WaitIdle(ctx, idle) == nil {
			cancel()
		}
	}()
	if err := r.Run(ctx); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// memStore returns an empty in-memory dedup store.
func memStore(t testing.TB) *memdedup.Store {
	t.Helper()
	s, err := memdedup.New(memdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// memBroker returns an in-memory broker closed when t ends.
func memBroker(t testing.TB, cfg memsource.Config) *memsource.Broker {
	b := memsource.New(cfg)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// memEnv is an in-memory broker and transactional store, for tests of the
// runner's own routing.
type memEnv struct {
	t      *testing.T
	broker *memsource.Broker
	store  *memdedup.Store
	topic  string

	mu    sync.Mutex
	calls map[string]int
}

func newMemEnv(t *testing.T, visibility time.Duration) *memEnv {
	t.Helper()
	return &memEnv{
		t: t, store: memStore(t), topic: "orders", calls: map[string]int{},
		broker: memBroker(t, memsource.Config{VisibilityTimeout: visibility, Seed: 1}),
	}
}

// handler counts calls per message key, then returns fail's error.
func (e *memEnv) handler(fail func(ctx context.Context, msg *consumer.Message) error) consumer.Path {
	return consumer.Transactional(e.store, func(ctx context.Context, tx *memdedup.Tx, msg *consumer.Message) error {
		e.mu.Lock()
		e.calls[msg.Key]++
		e.mu.Unlock()
		if fail != nil {
			return fail(ctx, msg)
		}
		return tx.Add("effects/"+msg.Key, 1)
	})
}

func (e *memEnv) called(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[key]
}

// run starts a runner on src (Name "robust" and short backoffs unless cfg
// sets them) and returns a stop function that cancels it and waits for Run.
func (e *memEnv) run(src consumer.Source, path consumer.Path, cfg consumer.Config) (*consumer.Runner, func()) {
	e.t.Helper()
	if cfg.Name == "" {
		cfg.Name = "robust"
	}
	if cfg.Retry.InitialBackoff == 0 {
		cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = 5*time.Millisecond, 20*time.Millisecond
	}
	return startRunner(e.t, src, path, cfg)
}
