package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/memdedup"
)

// keyEvents records the claim and commit events of each key.
type keyEvents struct {
	mu      sync.Mutex
	claims  map[string][]consumer.ClaimInfo
	commits map[string][]consumer.CommitInfo
	settled map[string][]consumer.Outcome
	starts  map[string]int
	ends    map[string]int
}

func newKeyEvents() *keyEvents {
	return &keyEvents{
		claims: map[string][]consumer.ClaimInfo{}, commits: map[string][]consumer.CommitInfo{},
		settled: map[string][]consumer.Outcome{}, starts: map[string]int{}, ends: map[string]int{},
	}
}

func (h *keyEvents) OnClaimed(_ context.Context, m *consumer.Message, c consumer.ClaimInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.claims[m.Key] = append(h.claims[m.Key], c)
}

func (h *keyEvents) OnCommit(_ context.Context, m *consumer.Message, c consumer.CommitInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.commits[m.Key] = append(h.commits[m.Key], c)
}

func (h *keyEvents) OnHandlerStart(ctx context.Context, m *consumer.Message) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.starts[m.Key]++
	return ctx
}

func (h *keyEvents) OnHandlerEnd(_ context.Context, m *consumer.Message, _ time.Duration, _ error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ends[m.Key]++
}

func (h *keyEvents) OnSettled(_ context.Context, m *consumer.Message, s consumer.SettleInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.settled[m.Key] = append(h.settled[m.Key], s.Outcome)
}

// check verifies, for each handled key of ks, one successful commit event
// (after its claim, timed) and that every other commit event is a failure
// wrapping ErrCommit and failedErr; it returns the number of failed commit
// events. Every settled delivery got at most one claim event.
func (h *keyEvents) check(t *testing.T, ks []string, failedErr error) (failed int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range ks {
		if !slices.Contains(h.settled[k], consumer.OutcomeHandled) {
			continue
		}
		ok := 0
		var okCommit consumer.CommitInfo
		var lastFailed time.Time
		for _, c := range h.commits[k] {
			switch {
			case c.Err == nil:
				ok++
				okCommit = c
			case errors.Is(c.Err, consumer.ErrCommit) && errors.Is(c.Err, failedErr):
				failed++
				if c.End.After(lastFailed) {
					lastFailed = c.End
				}
			default:
				t.Errorf("key %s: commit event with unexpected error %v", k, c.Err)
			}
			if c.Start.IsZero() || c.End.Before(c.Start) {
				t.Errorf("key %s: commit event not timed: %+v", k, c)
			}
		}
		if ok != 1 {
			t.Errorf("key %s: %d successful commit events, want 1 (%+v)", k, ok, h.commits[k])
			continue
		}
		if len(h.claims[k]) > len(h.settled[k]) {
			t.Errorf("key %s: %d claim events for %d settled deliveries", k, len(h.claims[k]), len(h.settled[k]))
		}
		var last consumer.ClaimInfo
		for _, c := range h.claims[k] {
			if c.State == dedup.StateNew {
				last = c
			}
		}
		if last.State != dedup.StateNew || last.Start.IsZero() || last.End.Before(last.Start) {
			t.Errorf("key %s: claim of the handled delivery %+v, want new and timed", k, last)
		} else if okCommit.Start.Before(last.End) {
			t.Errorf("key %s: reported claim ended at %v, after its commit began at %v", k, last.End, okCommit.Start)
		} else if last.Start.Before(lastFailed) {
			// The claim of an earlier, rolled-back transaction.
			t.Errorf("key %s: reported claim began at %v, before its failed commit ended at %v", k, last.Start, lastFailed)
		}
	}
	return failed
}

// On the transactional path, a batch whose handler fails is rerun without
// the culprit, and a failed commit is retried: each message gets one
// successful commit event (of the transaction that committed it), a failure
// event per failed commit it was part of, none for a rolled-back
// transaction, and one timed claim event; duplicates get a timed claim too.
func TestTxHooksReportClaimsAndCommits(t *testing.T) {
	store := memStore(t)
	// The batch's first transaction fails in the handler of "bad", its
	// rerun without "bad" fails to commit, its retry commits.
	store.Inject(memdedup.Fault{Kind: memdedup.CommitError})
	b := memBroker(t, memsource.Config{VisibilityTimeout: 100 * time.Millisecond, Seed: 1})

	var mu sync.Mutex
	calls := map[string]int{}
	path := consumer.Transactional(store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls[m.Key]++
		if m.Key == "bad" && calls[m.Key] == 1 {
			return errors.New("downstream busy")
		}
		return nil
	})
	rec := newKeyEvents()
	r := newRunner(t, b.Source("t"), path, consumer.Config{
		Name: "txhooks", Concurrency: 1, BatchSize: 10, Hooks: []consumer.Hook{rec},
		Retry: consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Jitter: -1},
	})
	ks := []string{"a", "b", "bad", "c", "d"}
	for _, k := range ks {
		b.Publish("t", memsource.Outgoing{Key: k, Body: []byte("body-" + k)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	if err := r.WaitIdle(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	b.Publish("t", memsource.Outgoing{Key: "a", Body: []byte("body-a")}) // a duplicate
	if err := r.WaitIdle(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	if st := r.Stats(); st.Handled != uint64(len(ks)) || st.CommitFailures != 1 {
		t.Fatalf("stats %+v, want %d handled and 1 commit failure", st, len(ks))
	}
	if failed := rec.check(t, ks, memdedup.ErrInjected); failed == 0 {
		t.Error("no failed commit event reported")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	dup := rec.claims["a"][len(rec.claims["a"])-1]
	if dup.State != dedup.StateDone || dup.Start.IsZero() {
		t.Errorf("claim of the duplicate of a: %+v, want a timed duplicate", dup)
	}
	for _, k := range ks {
		if rec.starts[k] != calls[k] || rec.ends[k] != calls[k] {
			t.Errorf("%s: %d handler starts and %d ends for %d calls", k, rec.starts[k], rec.ends[k], calls[k])
		}
	}
	if n := len(rec.commits["a"]); n != 2 { // the failed commit and its retry
		t.Errorf("a: %d commit events, want 2: %+v", n, rec.commits["a"])
	}
}

// With PostgreSQL, a commit refused for a deferred constraint halves the
// batch until the culprit is alone: every other message gets one successful
// commit event, and the refused commits are reported as failures.
func TestTxHooksRefusedCommitPostgres(t *testing.T) {
	f := newFixture(t)
	allowed := strings.Replace(f.table, `"effects"`, `"allowed"`, 1)
	f.exec(`CREATE TABLE ` + allowed + ` (key text PRIMARY KEY)`)
	f.exec(`ALTER TABLE ` + f.table + ` ADD FOREIGN KEY (key) REFERENCES ` + allowed + ` DEFERRABLE INITIALLY DEFERRED`)
	ks := keys(8, "d")
	for _, k := range ks {
		if k != "d005" {
			f.exec(`INSERT INTO `+allowed+` VALUES ($1)`, k)
		}
	}
	f.publish(ks...)
	rec := newKeyEvents()
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(nil)),
		consumer.Config{Concurrency: 1, BatchSize: 8, Retry: quickRetry(1), Hooks: []consumer.Hook{rec}})
	f.settled()
	r.stop()
	good := slices.DeleteFunc(slices.Clone(ks), func(k string) bool { return k == "d005" })
	f.requireOnce(good...)
	if failed := rec.check(t, good, dedup.ErrTxRefused); failed == 0 {
		t.Error("no refused commit event reported for the culprit's batch-mates")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, c := range rec.commits["d005"] {
		if !errors.Is(c.Err, dedup.ErrTxRefused) {
			t.Errorf("d005: commit event %+v, want only refused commits", c)
		}
	}
	if len(rec.commits["d005"]) == 0 {
		t.Error("d005: no refused commit event")
	}
}

// handlerErrs records the error of every handler end, by key, and the
// sizes of the batches formed.
type handlerErrs struct {
	*keyEvents
	errs    map[string][]error
	batches []int
}

func (h *handlerErrs) OnHandlerEnd(ctx context.Context, m *consumer.Message, d time.Duration, err error) {
	h.keyEvents.OnHandlerEnd(ctx, m, d, err)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errs[m.Key] = append(h.errs[m.Key], err)
}

func (h *handlerErrs) OnBatch(_ context.Context, size int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.batches = append(h.batches, size)
}

// The batch API fires the events of the per-message transactional path:
// each message of a handler call gets a handler start and end (the error of
// a MessageError goes to its message only), a timed claim (new or
// duplicate), one successful commit event, and the batch is reported; so
// that hooks such as otelidemq cover batch users.
func TestTxBatchHooksMatchPerMessagePath(t *testing.T) {
	store := memStore(t)
	// The batch's first transaction fails in the handler for "bad", its
	// rerun without "bad" fails to commit, its retry commits.
	store.Inject(memdedup.Fault{Kind: memdedup.CommitError})
	b := memBroker(t, memsource.Config{VisibilityTimeout: 100 * time.Millisecond, Seed: 1})

	type order struct{ K string }
	var mu sync.Mutex
	calls := map[string]int{}
	failedOnce := false
	path := consumer.TransactionalBatch(store, consumer.TxBatchJSON(func(ctx context.Context, _ *memdedup.Tx, items []consumer.BatchItem[order]) error {
		mu.Lock()
		defer mu.Unlock()
		for _, it := range items {
			calls[it.Msg.Key]++
		}
		for _, it := range items {
			if it.Value.K == "bad" && !failedOnce {
				failedOnce = true
				return &consumer.MessageError{Msg: it.Msg, Err: errors.New("downstream busy")}
			}
		}
		return nil
	}))
	rec := &handlerErrs{keyEvents: newKeyEvents(), errs: map[string][]error{}}
	r := newRunner(t, b.Source("t"), path, consumer.Config{
		Name: "txbatchhooks", Concurrency: 1, BatchSize: 10, Hooks: []consumer.Hook{rec},
		Retry: consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Jitter: -1},
	})
	ks := []string{"a", "b", "bad", "c", "d"}
	for _, k := range ks {
		b.Publish("t", memsource.Outgoing{Key: k, Body: []byte(`{"K":"` + k + `"}`)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	if err := r.WaitIdle(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	b.Publish("t", memsource.Outgoing{Key: "a", Body: []byte(`{"K":"a"}`)}) // a duplicate
	if err := r.WaitIdle(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	st := r.Stats()
	if st.Handled != uint64(len(ks)) || st.CommitFailures != 1 || st.Duplicates != 1 {
		t.Fatalf("stats %+v, want %d handled, 1 commit failure, 1 duplicate", st, len(ks))
	}
	if failed := rec.check(t, ks, memdedup.ErrInjected); failed == 0 {
		t.Error("no failed commit event reported")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	dup := rec.claims["a"][len(rec.claims["a"])-1]
	if dup.State != dedup.StateDone || dup.Reason != consumer.DuplicateProducer || dup.Start.IsZero() {
		t.Errorf("claim of the duplicate of a: %+v, want a timed producer duplicate", dup)
	}
	for _, k := range ks {
		if rec.starts[k] != calls[k] || rec.ends[k] != calls[k] {
			t.Errorf("%s: %d handler starts and %d ends for %d handler calls with it", k, rec.starts[k], rec.ends[k], calls[k])
		}
		var failed int
		for _, err := range rec.errs[k] {
			if err != nil {
				failed++
			}
		}
		if want := map[bool]int{true: 1}[k == "bad"]; failed != want {
			t.Errorf("%s: %d handler ends with an error (%v), want %d", k, failed, rec.errs[k], want)
		}
	}
	if len(rec.batches) == 0 {
		t.Error("no batch reported")
	}
}

// txEvents records the transactions (HookTx) and the handler starts of a
// hook that implements HookTx; HookReceived tags each message's context
// with its key.
type txEvents struct {
	mu     sync.Mutex
	txs    []txEvent
	starts int
}

type txEvent struct {
	claimed, fresh []string
	t              consumer.TxInfo
}

type keyTag struct{}

func (h *txEvents) OnReceived(ctx context.Context, m *consumer.Message) context.Context {
	return context.WithValue(ctx, keyTag{}, m.Key)
}

func (h *txEvents) OnTx(_ context.Context, t consumer.TxInfo) {
	keys := func(cs []context.Context) []string {
		var ks []string
		for _, c := range cs {
			k, _ := c.Value(keyTag{}).(string)
			ks = append(ks, k)
		}
		return ks
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.txs = append(h.txs, txEvent{claimed: keys(t.Claimed), fresh: keys(t.New), t: t})
}

func (h *txEvents) OnHandlerStart(ctx context.Context, _ *consumer.Message) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.starts++
	return ctx
}

// HookTx gets each transaction once, with its messages' contexts, the
// claim, the batch handler's call and the commit; it is not called per
// message for a batch handler's call over several messages (a hook without
// HookTx still is), and ClaimInfo and CommitInfo say how many messages
// their claim and commit covered.
func TestHookTxReportsEachTransactionOnce(t *testing.T) {
	store := memStore(t)
	// The first transaction fails in the handler for "bad", its rerun
	// without "bad" fails to commit; the retries commit.
	store.Inject(memdedup.Fault{Kind: memdedup.CommitError})
	b := memBroker(t, memsource.Config{VisibilityTimeout: 100 * time.Millisecond, Seed: 1})
	type order struct{ K string }
	var mu sync.Mutex
	var calls, oneCalls, items int
	failedOnce := false
	path := consumer.TransactionalBatch(store, consumer.TxBatchJSON(func(ctx context.Context, _ *memdedup.Tx, batch []consumer.BatchItem[order]) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		items += len(batch)
		if len(batch) == 1 {
			oneCalls++
		}
		for _, it := range batch {
			if it.Value.K == "bad" && !failedOnce {
				failedOnce = true
				return &consumer.MessageError{Msg: it.Msg, Err: errors.New("downstream busy")}
			}
		}
		return nil
	}))
	plain := newKeyEvents()
	txh := &txEvents{}
	r := newRunner(t, b.Source("t"), path, consumer.Config{
		Name: "hooktx", Concurrency: 1, BatchSize: 10, Hooks: []consumer.Hook{plain, txh},
		Retry: consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Jitter: -1},
	})
	ks := []string{"a", "b", "bad", "c", "d"}
	for _, k := range ks {
		b.Publish("t", memsource.Outgoing{Key: k, Body: []byte(`{"K":"` + k + `"}`)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	if err := r.WaitIdle(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Handled != uint64(len(ks)) || st.CommitFailures != 1 {
		t.Fatalf("stats %+v, want %d handled and 1 commit failure", st, len(ks))
	}

	txh.mu.Lock()
	defer txh.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	committed := map[string]int{}
	var handlerCalls, failedCalls, failedCommits int
	for i, e := range txh.txs {
		ti := e.t
		if len(e.claimed) == 0 || slices.Contains(e.claimed, "") || slices.Contains(e.fresh, "") {
			t.Errorf("tx %d: claimed %q, new %q: want the messages' contexts", i, e.claimed, e.fresh)
		}
		if ti.ClaimStart.IsZero() || ti.ClaimEnd.Before(ti.ClaimStart) || ti.ClaimErr != nil {
			t.Errorf("tx %d: claim %v..%v, %v", i, ti.ClaimStart, ti.ClaimEnd, ti.ClaimErr)
		}
		if !ti.HandlerStart.IsZero() {
			handlerCalls++
			if ti.HandlerErr != nil {
				failedCalls++
			}
		}
		if ti.Commit.Start.IsZero() {
			continue
		}
		if ti.Commit.Messages != len(e.fresh) {
			t.Errorf("tx %d: commit of %d messages, %d new", i, ti.Commit.Messages, len(e.fresh))
		}
		if ti.Commit.Err != nil {
			failedCommits++
			continue
		}
		for _, k := range e.fresh {
			committed[k]++
		}
	}
	if handlerCalls != calls || failedCalls != 1 || failedCommits != 1 {
		t.Errorf("%d handler calls (%d failed) and %d failed commits reported; want %d, 1, 1", handlerCalls, failedCalls, failedCommits, calls)
	}
	for _, k := range ks {
		if committed[k] != 1 {
			t.Errorf("key %s committed in %d reported transactions, want 1", k, committed[k])
		}
	}
	if txh.starts != oneCalls {
		t.Errorf("HookTx hook got %d handler starts, want %d (the calls over one message)", txh.starts, oneCalls)
	}
	plain.mu.Lock()
	defer plain.mu.Unlock()
	var starts int
	for _, n := range plain.starts {
		starts += n
	}
	if starts != items {
		t.Errorf("plain hook got %d handler starts, want %d (one per message of each call)", starts, items)
	}
	for k, cs := range plain.claims {
		for _, c := range cs {
			if !c.Start.IsZero() && c.Messages < 1 {
				t.Errorf("key %s: claim of %d messages", k, c.Messages)
			}
		}
	}
	for k, cs := range plain.commits {
		for _, c := range cs {
			if c.Messages < 1 {
				t.Errorf("key %s: commit of %d messages", k, c.Messages)
			}
		}
	}
}
