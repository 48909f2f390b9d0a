package consumer_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
)

// gatedAcks passes Ack to the source once release is closed, and records the
// keys of every call.
type gatedAcks struct {
	consumer.Source
	release chan struct{}

	mu    sync.Mutex
	calls [][]string
}

func (g *gatedAcks) Ack(ctx context.Context, msgs []*consumer.Message) error {
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		keys[i] = m.Key
	}
	g.mu.Lock()
	g.calls = append(g.calls, keys)
	g.mu.Unlock()
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Source.Ack(ctx, msgs)
}

// A lane handles its next message while the broker confirms the last one
// (one lane, BatchSize 1, the first Ack held back): every message is
// handled before that Ack returns, and what settled meanwhile leaves in
// order, in one more Ack call. Before, the lane waited for each Ack.
func TestLaneHandlesWhileAckInFlight(t *testing.T) {
	store := memStore(t)
	b := memBroker(t, memsource.Config{VisibilityTimeout: time.Minute})
	keys := []string{"a", "b", "c", "d"}
	for _, k := range keys {
		b.Publish("t", memsource.Outgoing{Key: k, Body: []byte("body-" + k)})
	}
	src := &gatedAcks{Source: b.Source("t"), release: make(chan struct{})}
	var mu sync.Mutex
	var handled []string
	all := make(chan struct{})
	path := consumer.Transactional(store, func(_ context.Context, _ *memdedup.Tx, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if handled = append(handled, m.Key); len(handled) == len(keys) {
			close(all)
		}
		return nil
	})
	r, stop := startRunner(t, src, path, consumer.Config{Name: "pipeline", Concurrency: 1, BatchSize: 1})
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("handled %v while the first Ack was held; want all of %v", handled, keys)
	}
	close(src.release)
	if err := r.WaitIdle(context.Background(), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	stop()
	src.mu.Lock()
	defer src.mu.Unlock()
	if got := slices.Concat(src.calls...); !slices.Equal(got, handled) {
		t.Errorf("acknowledged %v (calls %v), want each handled message once, in order %v", got, src.calls, handled)
	}
	if len(src.calls) >= len(keys) {
		t.Errorf("%d Ack calls for %d messages, want the ones settled while an Ack was in flight sent together", len(src.calls), len(keys))
	}
	if st := b.Stats("t"); st.Pending != 0 {
		t.Errorf("broker %+v, want nothing pending", st)
	}
}
