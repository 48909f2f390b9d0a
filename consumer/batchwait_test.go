package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// batchSizes records the size of every batch a Runner forms.
type batchSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batchSizes) OnBatch(_ context.Context, size int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sizes = append(b.sizes, size)
}

func (b *batchSizes) get() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.sizes)
}

// batchWaitRunner is a one-lane Runner over topic "t" of broker, on the
// transactional path over an in-memory store, with BatchSize 10.
func batchWaitRunner(t *testing.T, b *memsource.Broker, wait time.Duration, sizes *batchSizes) *consumer.Runner {
	t.Helper()
	path := consumer.Transactional(memStore(t), func(context.Context, *memdedup.Tx, *consumer.Message) error { return nil })
	return newRunner(t, b.Source("t"), path, consumer.Config{
		Name: "batch-wait", Concurrency: 1, BatchSize: 10, BatchWait: wait, Hooks: []consumer.Hook{sizes},
	})
}

func publishKeys(b *memsource.Broker, keys ...string) {
	for _, k := range keys {
		b.Publish("t", memsource.Outgoing{Key: k, Body: []byte("body-" + k)})
	}
}

// A lane that took one message waits BatchWait for more: the nine that
// arrive meanwhile join its batch. Without a wait the first message is a
// batch of its own, and the nine follow in one batch or more.
func TestBatchWaitFillsTheBatch(t *testing.T) {
	for _, tc := range []struct {
		wait time.Duration
		ok   func([]int) bool
		want string
	}{
		{time.Minute, func(s []int) bool { return slices.Equal(s, []int{10}) }, "[10]"},
		{0, func(s []int) bool { return len(s) >= 2 && s[0] == 1 }, "[1 ...]"},
	} {
		b := memBroker(t, memsource.Config{VisibilityTimeout: 5 * time.Minute})
		sizes := new(batchSizes)
		r := batchWaitRunner(t, b, tc.wait, sizes)
		publishKeys(b, "k0")
		stop := runtest.Start(t, r)
		runtest.WaitFor(t, runtest.Timeout, runtest.Say("the first message received"), func() bool { return r.Stats().Received == 1 })
		if tc.wait == 0 {
			runtest.WaitFor(t, runtest.Timeout, runtest.Say("the first message handled"), func() bool { return r.Stats().Handled == 1 })
		}
		publishKeys(b, "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9")
		runtest.WaitFor(t, runtest.Timeout, func() string { return fmt.Sprintf("all 10 handled; batches %v", sizes.get()) },
			func() bool { return r.Stats().Handled == 10 })
		stop()
		if got := sizes.get(); !tc.ok(got) {
			t.Errorf("BatchWait %v: batches of %v, want %s", tc.wait, got, tc.want)
		}
	}
}

// A batch that does not fill starts when BatchWait has passed.
func TestBatchWaitStartsAPartialBatch(t *testing.T) {
	b := memBroker(t, memsource.Config{VisibilityTimeout: 5 * time.Minute})
	sizes := new(batchSizes)
	r := batchWaitRunner(t, b, 50*time.Millisecond, sizes)
	publishKeys(b, "a", "b", "c")
	stop := runtest.Start(t, r)
	runtest.WaitFor(t, runtest.Timeout, runtest.Say("3 handled"), func() bool { return r.Stats().Handled == 3 })
	stop()
	if got := sizes.get(); !slices.Equal(got, []int{3}) {
		t.Errorf("batches of %v, want one of 3", got)
	}
}

// Stopping the Runner ends a lane's wait: the message it holds is handled
// at once, within the drain, not after BatchWait.
func TestBatchWaitEndsWhenTheRunnerStops(t *testing.T) {
	b := memBroker(t, memsource.Config{VisibilityTimeout: 5 * time.Minute})
	sizes := new(batchSizes)
	r := batchWaitRunner(t, b, time.Hour, sizes)
	publishKeys(b, "a")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	runtest.WaitFor(t, runtest.Timeout, runtest.Say("the message received"), func() bool { return r.Stats().Received == 1 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(runtest.Timeout):
		t.Fatal("Run did not return while a lane waited for its batch to fill")
	}
	if st := r.Stats(); st.Handled != 1 {
		t.Errorf("stats %+v, want the waiting message handled in the drain", st)
	}
	if st := b.Stats("t"); st.Pending != 0 {
		t.Errorf("broker %+v, want nothing pending", st)
	}
}

func TestBatchWaitMustNotBeNegative(t *testing.T) {
	b := memBroker(t, memsource.Config{})
	store := memStore(t)
	path := consumer.Transactional(store, func(context.Context, *memdedup.Tx, *consumer.Message) error { return nil })
	_, err := consumer.NewRunner(b.Source("t"), path, consumer.Config{Name: "x", BatchWait: -time.Second})
	var ce *idemq.ConfigError
	if !errors.As(err, &ce) || ce.Field != "BatchWait" {
		t.Errorf("NewRunner with a negative BatchWait = %v, want a *idemq.ConfigError for BatchWait", err)
	}
}
