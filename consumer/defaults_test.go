package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// The default config batches what is queued and nothing more: a lone
// message is a batch of its own, a backlog shares transactions of up to
// 100 (Config.BatchSize's default), and BatchSize 1 still gives one transaction per
// message.
func TestDefaultConfigBatchesWhatIsQueued(t *testing.T) {
	run := func(t *testing.T, batchSize, n int) []int {
		t.Helper()
		b := memBroker(t, memsource.Config{VisibilityTimeout: 5 * time.Minute})
		store := memStore(t)
		sizes := new(batchSizes)
		path := consumer.Transactional(store, func(context.Context, *memdedup.Tx, *consumer.Message) error { return nil })
		r := newRunner(t, b.Source("t"), path, consumer.Config{
			Name: "defaults", Concurrency: 1, BatchSize: batchSize, Hooks: []consumer.Hook{sizes},
		})
		for i := range n {
			publishKeys(b, fmt.Sprintf("k%03d", i))
		}
		stop := runtest.Start(t, r)
		runtest.WaitFor(t, runtest.Timeout, runtest.Say("every message handled"), func() bool { return r.Stats().Handled == uint64(n) })
		stop()
		return sizes.get()
	}
	t.Run("lone message", func(t *testing.T) {
		if s := run(t, 0, 1); !slices.Equal(s, []int{1}) {
			t.Fatalf("batches %v, want [1]", s)
		}
	})
	t.Run("backlog", func(t *testing.T) {
		s := run(t, 0, 300)
		if len(s) == 300 || slices.Max(s) > 100 {
			t.Fatalf("300 queued messages ran in %d batches, the largest of %d: the default config must share transactions among queued messages, up to 100 each",
				len(s), slices.Max(s))
		}
	})
	t.Run("batch size 1", func(t *testing.T) {
		if s := run(t, 1, 20); len(s) != 20 || slices.Max(s) != 1 {
			t.Fatalf("batches %v, want 20 batches of 1", s)
		}
	})
}
