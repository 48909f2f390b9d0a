package memsource_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
)

// orderLog merges the store's commits and the broker's acknowledgements in
// the order they happened.
type orderLog struct {
	mu        sync.Mutex
	committed map[string]bool
	early     []string // keys acknowledged before their commit
	acks      int
}

func (l *orderLog) commit(e memdedup.Event) {
	if e.Kind != memdedup.EventCommit {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range e.Keys {
		l.committed[k.Key] = true
	}
}

func (l *orderLog) broker(e memsource.Event) {
	if e.Kind != memsource.EventAck {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acks++
	if !l.committed[e.Key] {
		l.early = append(l.early, e.Key)
	}
}

// TestRunnerExactlyOnceUnderFaults runs two Runners on two competing sources
// of a broker that duplicates, redelivers concurrently, drops and fails acks
// and fails receives, and checks that every effect is applied exactly once
// and no message is acknowledged before the commit that recorded it.
func TestRunnerExactlyOnceUnderFaults(t *testing.T) {
	log := &orderLog{committed: make(map[string]bool)}
	store, err := memdedup.New(memdedup.Config{OnEvent: log.commit})
	if err != nil {
		t.Fatal(err)
	}
	b := memsource.New(memsource.Config{VisibilityTimeout: 200 * time.Millisecond, Seed: 42, OnEvent: log.broker})
	defer b.Close()
	for _, f := range []memsource.Fault{
		{Kind: memsource.Redelivered, Probability: 0.1, Times: -1},
		{Kind: memsource.ConcurrentDuplicate, Probability: 0.1, Times: -1},
		{Kind: memsource.CrashAfterCommit, Probability: 0.2, Times: -1},
		{Kind: memsource.AckError, Probability: 0.05, Times: -1},
		{Kind: memsource.ReceiveError, Probability: 0.05, Times: -1},
		{Kind: memsource.RetryError, Probability: 0.1, Times: -1},
	} {
		b.Inject(f)
	}
	store.Inject(memdedup.Fault{Kind: memdedup.CommitError, Applied: true, Times: 3})

	const n = 200
	var msgs []memsource.Outgoing
	for i := range n {
		msgs = append(msgs, memsource.Outgoing{Key: fmt.Sprintf("order-%03d", i), Body: fmt.Appendf(nil, `{"n":%d}`, i)})
	}
	b.Publish("orders", msgs...)
	b.Publish("orders", msgs[:20]...) // a producer that sent some twice

	var calls sync.Map // keys whose handler ran before
	handler := func(ctx context.Context, tx *memdedup.Tx, msg *consumer.Message) error {
		// The first run of every key ending in 7 fails: its writes and its
		// record roll back, and the retry runs it again.
		if _, again := calls.LoadOrStore(msg.Key, true); !again && strings.HasSuffix(msg.Key, "7") {
			return fmt.Errorf("scripted failure of %s", msg.Key)
		}
		return tx.Add(msg.Key, 1)
	}
	cfg := consumer.Config{
		Name: "orders", Concurrency: 3, BatchSize: 4,
		Retry: consumer.RetryPolicy{MaxAttempts: 50, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var runners []*consumer.Runner
	for range 2 {
		r, err := consumer.NewRunner(b.Source("orders"), consumer.Transactional(store, handler), cfg)
		if err != nil {
			t.Fatal(err)
		}
		runners = append(runners, r)
		wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}

	deadline := time.Now().Add(60 * time.Second)
	for b.Stats("orders").Pending > 0 {
		if time.Now().After(deadline) {
			cancel()
			wg.Wait()
			t.Fatalf("messages still pending after 60s: %+v; runners: %+v %+v", b.Stats("orders"), runners[0].Stats(), runners[1].Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()

	values := store.Values()
	for _, m := range msgs {
		if values[m.Key] != 1 {
			t.Errorf("effect of %s applied %d times, want 1", m.Key, values[m.Key])
		}
	}
	if len(values) != n {
		t.Errorf("%d effects, want %d", len(values), n)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.early) > 0 {
		t.Errorf("acknowledged before commit: %v", log.early)
	}
	st := b.Stats("orders")
	t.Logf("broker: %+v", st)
	t.Logf("runners: %+v / %+v", runners[0].Stats(), runners[1].Stats())
	var retried uint64
	for _, r := range runners {
		retried += r.Stats().Retried
	}
	if retried < 20 {
		t.Errorf("runners retried %d messages; the 20 scripted handler failures alone need 20", retried)
	}
	if st.Redeliveries == 0 || st.DroppedAcks == 0 || st.DeadLettered != 0 {
		t.Errorf("faults did not fire as scripted, or something was dead-lettered: %+v", st)
	}
	if store.OpenTxs() != 0 {
		t.Errorf("%d transactions left open", store.OpenTxs())
	}
}
