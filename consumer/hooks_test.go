package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/memdedup"
)

// recordingHook implements every Hook* interface and counts the events.
type recordingHook struct {
	mu           sync.Mutex
	received     int
	batches      int
	batchSizes   int
	claimedNew   int
	duplicates   map[consumer.DuplicateReason]int
	dupKeys      map[string]consumer.DuplicateReason
	starts, ends int
	handlerErrs  int
	commits      int
	ackCalls     int
	ackFailed    int
	retries      map[consumer.RetryKind]int
	deadLetters  map[consumer.DeadLetterReason]int
	leaseLost    int
	refreshFail  int
	settled      map[consumer.Outcome]int
	settledIDs   map[string]int // per delivery: message ID + attempt
	ctxMarked    int            // events whose ctx carried OnReceived's value
	handlerMark  int            // handlers whose ctx carried OnReceived's value
}

type markKey struct{}

func newRecordingHook() *recordingHook {
	return &recordingHook{
		duplicates: map[consumer.DuplicateReason]int{}, dupKeys: map[string]consumer.DuplicateReason{},
		retries: map[consumer.RetryKind]int{}, deadLetters: map[consumer.DeadLetterReason]int{},
		settled: map[consumer.Outcome]int{}, settledIDs: map[string]int{},
	}
}

func (h *recordingHook) mark(ctx context.Context) {
	if ctx.Value(markKey{}) != nil {
		h.ctxMarked++
	}
}

func (h *recordingHook) OnReceived(ctx context.Context, m *consumer.Message) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.received++
	return context.WithValue(ctx, markKey{}, m.ID)
}

func (h *recordingHook) OnBatch(ctx context.Context, size int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.batches++
	h.batchSizes += size
}

func (h *recordingHook) OnClaimed(ctx context.Context, m *consumer.Message, c consumer.ClaimInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mark(ctx)
	switch c.State {
	case dedup.StateNew:
		h.claimedNew++
	case dedup.StateDone:
		h.duplicates[c.Reason]++
		h.dupKeys[m.Key] = c.Reason
	}
}

func (h *recordingHook) OnHandlerStart(ctx context.Context, m *consumer.Message) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.starts++
	if ctx.Value(markKey{}) == m.ID {
		h.handlerMark++
	}
	return ctx
}

func (h *recordingHook) OnHandlerEnd(ctx context.Context, m *consumer.Message, d time.Duration, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ends++
	if err != nil {
		h.handlerErrs++
	}
}

func (h *recordingHook) OnCommit(ctx context.Context, m *consumer.Message, c consumer.CommitInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mark(ctx)
	h.commits++
}

func (h *recordingHook) OnAck(ctx context.Context, a consumer.AckInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ackCalls++
	if a.Err != nil {
		h.ackFailed += len(a.Messages)
	}
}

func (h *recordingHook) OnRetry(ctx context.Context, m *consumer.Message, kind consumer.RetryKind, delay time.Duration, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mark(ctx)
	h.retries[kind]++
}

func (h *recordingHook) OnDeadLetter(ctx context.Context, m *consumer.Message, reason consumer.DeadLetterReason, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mark(ctx)
	h.deadLetters[reason]++
}

func (h *recordingHook) OnLeaseLost(ctx context.Context, m *consumer.Message, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leaseLost++
}

func (h *recordingHook) OnLeaseRefreshFailed(ctx context.Context, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refreshFail++
}

func (h *recordingHook) OnSettled(ctx context.Context, m *consumer.Message, s consumer.SettleInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mark(ctx)
	h.settled[s.Outcome]++
	h.settledIDs[m.ID+"#"+string(rune('0'+m.Attempt))]++
}

// hookScenario runs, over memsource and memdedup, a run with a concurrent
// duplicate (same key twice in one batch), a producer re-send, redeliveries
// after a dropped and a failed ack, a handler retry, a permanent failure and
// exhausted attempts. It returns the runner after it stopped.
func hookScenario(t *testing.T, leased bool, hs ...consumer.Hook) *consumer.Runner {
	t.Helper()
	store := memStore(t)
	b := memBroker(t, memsource.Config{VisibilityTimeout: 100 * time.Millisecond, Seed: 1})
	b.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Key: "drop"})
	b.Inject(memsource.Fault{Kind: memsource.AckError, Key: "ackerr"})

	var mu sync.Mutex
	calls := map[string]int{}
	h := func(ctx context.Context, m *consumer.Message) error {
		mu.Lock()
		calls[m.Key]++
		n := calls[m.Key]
		mu.Unlock()
		switch {
		case m.Key == "retry" && n == 1:
			return errors.New("downstream busy")
		case m.Key == "perm":
			return consumer.Permanent(errors.New("refused"))
		case m.Key == "max":
			return errors.New("always failing")
		}
		return nil
	}
	var path consumer.Path
	if leased {
		path = consumer.Leased(store.Leases(), h, consumer.LeaseOptions{})
	} else {
		path = consumer.Transactional(store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error { return h(ctx, m) })
	}
	r := newRunner(t, b.Source("t"), path, consumer.Config{
		Name: "hooks", Concurrency: 1, BatchSize: 10, Hooks: hs,
		Retry: consumer.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Jitter: -1},
	})
	for _, k := range []string{"a", "same", "same", "re", "drop", "ackerr", "retry", "perm", "max"} {
		b.Publish("t", memsource.Outgoing{Key: k, Body: []byte("body-" + k)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	if err := r.WaitIdle(ctx, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// A producer's re-send: another broker message with a processed key.
	b.Publish("t", memsource.Outgoing{Key: "re", Body: []byte("body-re")})
	if err := r.WaitIdle(ctx, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return r
}

// A hook that implements every event sees each message received and settled
// exactly once, duplicates with the right reason, and as many duplicates,
// retries, dead letters and ack failures as Stats counts.
func TestHooksSeeEventsMatchingStats(t *testing.T) {
	for name, leased := range map[string]bool{"transactional": false, "leased": true} {
		t.Run(name, func(t *testing.T) {
			rec := newRecordingHook()
			r := hookScenario(t, leased, rec)
			st := r.Stats()
			rec.mu.Lock()
			defer rec.mu.Unlock()

			if uint64(rec.received) != st.Received {
				t.Errorf("received events %d, Stats.Received %d", rec.received, st.Received)
			}
			total := 0
			for _, n := range rec.settled {
				total += n
			}
			if uint64(total) != st.Received {
				t.Errorf("settled events %d (%v), Stats.Received %d", total, rec.settled, st.Received)
			}
			for id, n := range rec.settledIDs {
				if n != 1 {
					t.Errorf("delivery %s settled %d times", id, n)
				}
			}
			if uint64(rec.batchSizes) != st.Received {
				t.Errorf("batch sizes add up to %d, Stats.Received %d", rec.batchSizes, st.Received)
			}
			dups := 0
			for _, n := range rec.duplicates {
				dups += n
			}
			if uint64(dups) != st.Duplicates || uint64(rec.settled[consumer.OutcomeDuplicate]) != st.Duplicates {
				t.Errorf("duplicate events %d, settled duplicates %d, Stats.Duplicates %d", dups, rec.settled[consumer.OutcomeDuplicate], st.Duplicates)
			}
			want := map[string]consumer.DuplicateReason{
				"re": consumer.DuplicateProducer, "drop": consumer.DuplicateRedelivery, "ackerr": consumer.DuplicateRedelivery,
			}
			for k, reason := range want {
				if got := rec.dupKeys[k]; got != reason {
					t.Errorf("duplicate of %q: reason %v, want %v", k, got, reason)
				}
			}
			// The two copies of "same" meet in one batch unless the lane
			// took the first before the second arrived.
			if got := rec.dupKeys["same"]; got != consumer.DuplicateConcurrent && got != consumer.DuplicateProducer {
				t.Errorf("duplicate of %q: reason %v, want concurrent (one batch) or producer", "same", got)
			}
			retries := rec.retries[consumer.RetryHandler] + rec.retries[consumer.RetryInfrastructure]
			if uint64(retries) != st.Retried || uint64(rec.settled[consumer.OutcomeRetried]) != st.Retried {
				t.Errorf("retry events %v, settled retried %d, Stats.Retried %d", rec.retries, rec.settled[consumer.OutcomeRetried], st.Retried)
			}
			if rec.retries[consumer.RetryHandler] < 2 { // "retry" once, "max" once
				t.Errorf("handler retries %d, want at least 2", rec.retries[consumer.RetryHandler])
			}
			dls := 0
			for _, n := range rec.deadLetters {
				dls += n
			}
			if uint64(dls) != st.DeadLettered || rec.deadLetters[consumer.DeadLetterPermanent] != 1 || rec.deadLetters[consumer.DeadLetterMaxAttempts] != 1 {
				t.Errorf("dead-letter events %v, Stats.DeadLettered %d; want 1 permanent and 1 max_attempts", rec.deadLetters, st.DeadLettered)
			}
			if uint64(rec.ackFailed) != st.AckFailures || st.AckFailures == 0 {
				t.Errorf("failed acks %d, Stats.AckFailures %d (want > 0)", rec.ackFailed, st.AckFailures)
			}
			if uint64(rec.settled[consumer.OutcomeHandled]) != st.Handled {
				t.Errorf("settled handled %d, Stats.Handled %d", rec.settled[consumer.OutcomeHandled], st.Handled)
			}
			if rec.starts != rec.ends || rec.starts == 0 {
				t.Errorf("handler starts %d, ends %d", rec.starts, rec.ends)
			}
			if rec.handlerMark != rec.starts {
				t.Errorf("%d of %d handler contexts carry the message's context values", rec.handlerMark, rec.starts)
			}
			if uint64(rec.commits) != st.Handled {
				t.Errorf("commit events %d, Stats.Handled %d", rec.commits, st.Handled)
			}
			if rec.claimedNew < int(st.Handled) {
				t.Errorf("claimed-new events %d, fewer than Stats.Handled %d", rec.claimedNew, st.Handled)
			}
			events := total + dups + retries + dls + rec.claimedNew + rec.commits
			if rec.ctxMarked != events {
				t.Errorf("%d of %d per-message events got the message's context", rec.ctxMarked, events)
			}
		})
	}
}

// A hook implementing none of the interfaces is accepted and ignored.
func TestHookWithoutEventsIsIgnored(t *testing.T) {
	r := hookScenario(t, false, struct{}{})
	if st := r.Stats(); st.Handled == 0 {
		t.Fatalf("nothing handled: %+v", st)
	}
}

// noopHook implements every event and does nothing, to measure the cost of
// the calls themselves.
type noopHook struct{}

func (noopHook) OnReceived(ctx context.Context, _ *consumer.Message) context.Context { return ctx }
func (noopHook) OnBatch(context.Context, int)                                        {}
func (noopHook) OnClaimed(context.Context, *consumer.Message, consumer.ClaimInfo)    {}
func (noopHook) OnHandlerStart(ctx context.Context, _ *consumer.Message) context.Context {
	return ctx
}
func (noopHook) OnHandlerEnd(context.Context, *consumer.Message, time.Duration, error) {}
func (noopHook) OnCommit(context.Context, *consumer.Message, consumer.CommitInfo)      {}
func (noopHook) OnAck(context.Context, consumer.AckInfo)                               {}
func (noopHook) OnSettled(context.Context, *consumer.Message, consumer.SettleInfo)     {}
func (noopHook) OnRetry(context.Context, *consumer.Message, consumer.RetryKind, time.Duration, error) {
}

// BenchmarkHooks runs messages through memsource and memdedup (transactional
// path, batch 100) with no hooks and with a hook that implements every event
// and does nothing.
func BenchmarkHooks(b *testing.B) {
	for _, bc := range []struct {
		name  string
		hooks []consumer.Hook
	}{{"none", nil}, {"noop", []consumer.Hook{noopHook{}}}} {
		b.Run(bc.name, func(b *testing.B) {
			br := memBroker(b, memsource.Config{})
			path := consumer.Transactional(memStore(b), func(context.Context, *memdedup.Tx, *consumer.Message) error { return nil })
			r := newRunner(b, br.Source("t"), path, consumer.Config{Name: "bench", Concurrency: 1, BatchSize: 100, Hooks: bc.hooks})
			msgs := make([]memsource.Outgoing, b.N)
			for i := range msgs {
				msgs[i] = memsource.Outgoing{Key: "k" + itoa(i), Body: []byte("body")}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ReportAllocs()
			b.ResetTimer()
			br.Publish("t", msgs...)
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			for r.Stats().Handled < uint64(b.N) {
				time.Sleep(100 * time.Microsecond)
			}
			b.StopTimer()
			cancel()
			if err := <-done; err != nil {
				b.Fatalf("Run: %v", err)
			}
		})
	}
}

func itoa(i int) string {
	var buf [20]byte
	n := len(buf)
	for {
		n--
		buf[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(buf[n:])
		}
	}
}

// outcomeAtHook records, per message, whether its outcome was visible
// through StoredResult when HookCommit and HookSettled were called.
type outcomeAtHook struct {
	mu                  sync.Mutex
	atCommit, atSettled map[string]bool
}

func (h *outcomeAtHook) OnCommit(_ context.Context, m *consumer.Message, _ consumer.CommitInfo) {
	_, _, ok := consumer.StoredResult(m)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.atCommit[m.Key] = ok
}

func (h *outcomeAtHook) OnSettled(_ context.Context, m *consumer.Message, _ consumer.SettleInfo) {
	_, _, ok := consumer.StoredResult(m)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.atSettled[m.Key] = ok
}

// On both paths HookCommit is told of a message's commit before its result
// is visible through StoredResult (it is marked handled once the hooks
// heard of the commit), and HookSettled sees it.
func TestCommitHookPrecedesOutcome(t *testing.T) {
	for name, leased := range map[string]bool{"transactional": false, "leased": true} {
		t.Run(name, func(t *testing.T) {
			store := memStore(t)
			b := memBroker(t, memsource.Config{})
			result := func(_ context.Context, m *consumer.Message) ([]byte, error) { return []byte("r-" + m.Key), nil }
			path := consumer.Leased(store.Leases(), consumer.Result(result), consumer.LeaseOptions{})
			if !leased {
				path = consumer.Transactional(store, consumer.TxResult(func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) ([]byte, error) {
					return result(ctx, m)
				}))
			}
			hook := &outcomeAtHook{atCommit: map[string]bool{}, atSettled: map[string]bool{}}
			r := newRunner(t, b.Source("t"), path, consumer.Config{Name: "outcome-at", Concurrency: 1, BatchSize: 10, Hooks: []consumer.Hook{hook}})
			keys := []string{"a", "b", "c"}
			for _, k := range keys {
				b.Publish("t", memsource.Outgoing{Key: k, Body: []byte("body-" + k)})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(runCtx) }()
			if err := r.WaitIdle(ctx, 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			hook.mu.Lock()
			defer hook.mu.Unlock()
			for _, k := range keys {
				if seen, ok := hook.atCommit[k]; !ok || seen {
					t.Errorf("key %q: committed %v; outcome visible at its commit event %v, want a commit event before it", k, ok, seen)
				}
				if !hook.atSettled[k] {
					t.Errorf("key %q: outcome not visible at its settled event", k)
				}
			}
		})
	}
}
