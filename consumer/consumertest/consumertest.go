package consumertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// Delivery is one scripted message.
type Delivery struct {
	// Key is the message's key (Message.Key), its deduplication key unless
	// Options.KeyFunc derives another. Required and unique within a script.
	Key string
	// Body is the payload handed to the handler.
	Body []byte
	// Headers are the message's headers; may be nil.
	Headers map[string]string
	// PartitionKey orders messages, as on a real broker.
	PartitionKey string
	// Fault is how the message is delivered, one of the kinds this package
	// re-exports (FaultKind): None (the default), Redelivered,
	// ConcurrentDuplicate, CrashAfterCommit or ProducerDuplicate. Replay
	// fails t on any other kind.
	Fault FaultKind
	// FailFirst makes the first FailFirst attempts fail after the handler
	// returned successfully, so that the transaction rolls back and the
	// message is retried. It shows that the handler's writes roll back
	// with it (nothing is applied twice).
	FailFirst int
}

// Options tunes Replay. The zero value is a good default.
type Options struct {
	// Workers is the number of runners competing for the messages, as
	// worker processes would. Defaults to 2.
	Workers int
	// BatchSize is each runner's batch size. Defaults to 1.
	BatchSize int
	// Timeout bounds the whole replay. Defaults to 30 s.
	Timeout time.Duration
	// Scope is the deduplication scope (consumer name). Defaults to
	// "consumertest" plus the test's name, so tests sharing a database do
	// not see each other's records.
	Scope string
	// Logger receives the runners' logs. Defaults to discarding them.
	Logger *slog.Logger
	// KeyFunc is the runners' consumer.Config.KeyFunc, so that a
	// production KeyFunc is tested with the handler. Scripted messages
	// carry Delivery.Key as Message.Key and their Headers. Defaults to
	// consumer.DefaultKey.
	KeyFunc func(*consumer.Message) (string, error)
	// HandlerTimeout is the runners' consumer.Config.HandlerTimeout.
	// Defaults to the runner's default.
	HandlerTimeout time.Duration
	// Retry is the runners' retry policy. Its zero fields default to short
	// backoffs (5 ms to 50 ms), so that a replay with failures settles
	// quickly; set MaxAttempts to see the dead letter your production
	// policy gives.
	Retry consumer.RetryPolicy
}

// Report is what happened during a replay.
type Report struct {
	// Deliveries counts deliveries made by the broker, redeliveries
	// included.
	Deliveries uint64
	// Calls counts handler calls per key, including calls whose
	// transaction rolled back.
	Calls map[string]int
	// Committed counts, per key, the handler calls whose transaction
	// committed: the number of times the effect happened. It must be 1.
	Committed map[string]int
	// Duplicates counts deliveries acknowledged without running the
	// handler.
	Duplicates uint64
	// DeadLetters lists the messages routed to the dead-letter
	// destination, with their reasons.
	DeadLetters []memsource.DeadLetter

	keys    []string
	running running
}

// running tracks the handler calls in progress, so that a replay that does
// not settle can say which handler it is waiting for.
type running struct {
	mu    sync.Mutex
	calls map[string]time.Time // key -> start of the call in progress
}

// start records a call for key and returns the function that ends it.
func (r *running) start(key string) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls == nil {
		r.calls = map[string]time.Time{}
	}
	r.calls[key] = time.Now()
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.calls, key)
	}
}

// describe names the calls in progress, longest first.
func (r *running) describe() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.calls) == 0 {
		return "no handler is running"
	}
	keys := make([]string, 0, len(r.calls))
	for k := range r.calls {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r.calls[keys[i]].Before(r.calls[keys[j]]) })
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  the handler for key %q has been running for %s", k, time.Since(r.calls[k]).Round(time.Millisecond))
	}
	b.WriteString("\n  a handler that waits for what the runner holds never returns: a second connection from a pool" +
		" the lanes' transactions use up, or a row its own transaction locked through another connection;" +
		" set Options.HandlerTimeout to see it fail instead")
	return b.String()
}

// TB is the part of testing.TB the kit uses; *testing.T and *testing.B
// satisfy it.
type TB interface {
	Helper()
	Name() string
	Fatalf(format string, args ...any)
}

// errInjected is returned for Delivery.FailFirst attempts.
var errInjected = errors.New("consumertest: injected failure after the handler")

// ReplayTx delivers script to handler through real Runners on the
// transactional path, over store (for example a pgdedup.Store on a test
// database), with the faults each Delivery asks for, and returns once every
// message is settled. It fails t if the replay does not settle within
// Options.Timeout. Check the result with Report.RequireExactlyOnce and your
// own queries of the business tables.
func ReplayTx[Tx any](t TB, store dedupdriver.TxStore[Tx], handler consumer.TxHandler[Tx], script []Delivery, opts Options) *Report {
	t.Helper()
	opts = opts.withDefaults(t)
	rep := &Report{Calls: map[string]int{}, Committed: map[string]int{}}
	cs := &countingStore[Tx]{Tx: store.Driver(), pending: map[any][]string{}, report: rep}
	fails := failFirst(script)
	h := func(ctx context.Context, tx Tx, msg *consumer.Message) error {
		key, err := rep.call(ctx, &cs.mu, fails, func() error { return handler(ctx, tx, msg) })
		if err == nil {
			cs.succeeded(tx, key)
		}
		return err
	}
	replay(t, consumer.Transactional(cs, h), script, opts, rep)
	return rep
}

// Replay is ReplayTx for the lease path (effects outside a database):
// handler runs through consumer.Leased over store (for example a
// redisdedup.Store). Committed counts the calls whose key was then marked
// done.
func Replay(t TB, store dedupdriver.LeaseStore, handler consumer.Handler, lease consumer.LeaseOptions, script []Delivery, opts Options) *Report {
	t.Helper()
	opts = opts.withDefaults(t)
	rep := &Report{Calls: map[string]int{}, Committed: map[string]int{}}
	ls := &countingLeases{Lease: store.Driver(), report: rep}
	fails := failFirst(script)
	h := func(ctx context.Context, msg *consumer.Message) error {
		_, err := rep.call(ctx, &ls.mu, fails, func() error { return handler(ctx, msg) })
		return err
	}
	replay(t, consumer.Leased(ls, h, lease), script, opts, rep)
	return rep
}

// failFirst returns the Delivery.FailFirst of each scripted key that has
// one.
func failFirst(script []Delivery) map[string]int {
	fails := map[string]int{}
	for _, d := range script {
		if d.FailFirst > 0 {
			fails[d.Key] = d.FailFirst
		}
	}
	return fails
}

// call runs a handler's call run for the message in ctx: it counts the
// call of its key in Calls (under mu, the lock of the counting driver),
// says it is running, and fails the first fails[key] calls that succeeded
// with errInjected. It returns the key.
func (r *Report) call(ctx context.Context, mu *sync.Mutex, fails map[string]int, run func() error) (string, error) {
	key, _ := consumer.DedupKey(ctx)
	mu.Lock()
	r.Calls[key]++
	call := r.Calls[key]
	mu.Unlock()
	end := r.running.start(key)
	err := run()
	end()
	if err == nil && call <= fails[key] {
		err = errInjected
	}
	return key, err
}

func (o Options) withDefaults(t TB) Options {
	if o.Workers == 0 {
		o.Workers = 2
	}
	if o.BatchSize == 0 {
		o.BatchSize = 1
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Scope == "" {
		o.Scope = "consumertest:" + t.Name()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Retry.InitialBackoff == 0 {
		o.Retry.InitialBackoff = 5 * time.Millisecond
	}
	if o.Retry.MaxBackoff == 0 {
		o.Retry.MaxBackoff = 50 * time.Millisecond
	}
	return o
}

const topic = "replay"

// replayVisibility is how long a delivery of the replay's broker stays
// invisible before it is delivered again (a lost acknowledgement's message
// comes back after it).
const replayVisibility = 200 * time.Millisecond

func replay(t TB, path consumer.Path, script []Delivery, opts Options, rep *Report) {
	t.Helper()
	broker := memsource.New(memsource.Config{VisibilityTimeout: replayVisibility})
	defer broker.Close()
	seen := map[string]bool{}
	for _, d := range script {
		if d.Key == "" || seen[d.Key] {
			t.Fatalf("consumertest: script keys must be non-empty and unique, got %q", d.Key)
		}
		seen[d.Key] = true
		rep.keys = append(rep.keys, dedupKey(opts, d))
		out := memsource.Outgoing{Key: d.Key, Body: d.Body, Headers: d.Headers, PartitionKey: d.PartitionKey}
		switch d.Fault {
		case None:
			broker.Publish(topic, out)
		case Redelivered, ConcurrentDuplicate, CrashAfterCommit:
			broker.Inject(memsource.Fault{Kind: d.Fault, Topic: topic, ID: broker.Publish(topic, out)[0]})
		case ProducerDuplicate:
			broker.Publish(topic, out, out)
		default:
			t.Fatalf("consumertest: fault %v is not a delivery's", d.Fault)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	runners := make([]*consumer.Runner, opts.Workers)
	for i := range runners {
		r, err := consumer.NewRunner(broker.Source(topic), path, consumer.Config{
			Name:           opts.Scope,
			Concurrency:    2,
			BatchSize:      opts.BatchSize,
			KeyFunc:        opts.KeyFunc,
			HandlerTimeout: opts.HandlerTimeout,
			Retry:          opts.Retry,
			Logger:         opts.Logger,
		})
		if err != nil {
			t.Fatalf("consumertest: %v", err)
		}
		runners[i] = r
		wg.Go(func() { _ = r.Run(ctx) })
	}

	deadline := time.Now().Add(opts.Timeout)
	for {
		st := broker.Stats(topic)
		ready, inFlight := st.Ready, st.InFlight
		if ready == 0 && inFlight == 0 {
			break
		}
		if time.Now().After(deadline) {
			blocked := rep.running.describe()
			cancel()
			wg.Wait()
			t.Fatalf("consumertest: replay did not settle within %s (broker: %d ready, %d in flight, %d pending): %s",
				opts.Timeout, ready, inFlight, ready+inFlight, blocked)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	rep.Deliveries = broker.Stats(topic).Deliveries
	for _, r := range runners {
		rep.Duplicates += r.Stats().Duplicates
	}
	rep.DeadLetters = broker.DeadLetters(topic)
}

// dedupKey returns the deduplication key the runners will see for d: the
// Options.KeyFunc's key when one is set (d.Key if it fails: the message is
// then dead-lettered, which RequireExactlyOnce reports), else d.Key.
func dedupKey(opts Options, d Delivery) string {
	if opts.KeyFunc == nil {
		return d.Key
	}
	k, err := opts.KeyFunc(&consumer.Message{Key: d.Key, Body: d.Body, Headers: d.Headers, PartitionKey: d.PartitionKey})
	if err != nil || k == "" {
		return d.Key
	}
	return k
}

// RequireExactlyOnce fails t unless every scripted key's effect happened
// exactly once and nothing was dead-lettered. It counts the handler calls
// whose transaction committed (or whose key was marked done); check your own
// tables as well, to see that the committed calls left the rows you expect.
func (r *Report) RequireExactlyOnce(t TB) {
	t.Helper()
	var bad []string
	for _, k := range r.keys {
		if n := r.Committed[k]; n != 1 {
			bad = append(bad, fmt.Sprintf("%s: %d effects (%d handler calls)", k, n, r.Calls[k]))
		}
	}
	sort.Strings(bad)
	for _, d := range r.DeadLetters {
		bad = append(bad, fmt.Sprintf("%s: dead-lettered: %s", d.Key, d.Reason))
	}
	if len(bad) > 0 {
		t.Fatalf("consumertest: not exactly once:\n  %s", strings.Join(bad, "\n  "))
	}
}

// countingStore is the driver the replay's Runner sees on the transactional
// path: the store's own driver, forwarded whole (Caps included, so the
// Runner takes the paths it takes for the store), counting per key the
// successful handler calls whose transaction committed.
type countingStore[Tx any] struct {
	dedupdriver.Tx[Tx]
	mu      sync.Mutex
	pending map[any][]string
	report  *Report
}

// Driver returns s: the replay hands s to consumer.Transactional.
func (s *countingStore[Tx]) Driver() dedupdriver.Tx[Tx] { return s }

func (s *countingStore[Tx]) succeeded(tx Tx, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending[any(tx)] = append(s.pending[any(tx)], key)
}

// ended forgets the handler calls of tx, counting them if it committed.
func (s *countingStore[Tx]) ended(tx Tx, committed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if committed {
		for _, k := range s.pending[any(tx)] {
			s.report.Committed[k]++
		}
	}
	delete(s.pending, any(tx))
}

// Commit commits through the store's driver and counts the keys of tx if
// it committed.
func (s *countingStore[Tx]) Commit(ctx context.Context, tx Tx) error {
	err := s.Tx.Commit(ctx, tx)
	s.ended(tx, err == nil)
	return err
}

// CommitChain chains through the store's driver and counts the keys of the
// transaction it committed, as Commit does.
func (s *countingStore[Tx]) CommitChain(ctx context.Context, tx Tx, scope string, recs []dedup.Record) ([]dedup.Claim, bool, error) {
	claims, committed, err := s.Tx.CommitChain(ctx, tx, scope, recs)
	s.ended(tx, committed)
	return claims, committed, err
}

// Rollback forgets the handler calls of tx and rolls it back through the
// store's driver.
func (s *countingStore[Tx]) Rollback(ctx context.Context, tx Tx) error {
	s.ended(tx, false)
	return s.Tx.Rollback(ctx, tx)
}

// countingLeases is the driver the replay's Runner sees on the lease path:
// the store's own driver, forwarded whole, counting the keys marked done.
type countingLeases struct {
	dedupdriver.Lease
	mu     sync.Mutex
	report *Report
}

// Driver returns s: the replay hands s to consumer.Leased.
func (s *countingLeases) Driver() dedupdriver.Lease { return s }

func (s *countingLeases) done(key string, err error) error {
	if err == nil {
		s.mu.Lock()
		s.report.Committed[key]++
		s.mu.Unlock()
	}
	return err
}

// Complete marks key done through the store's driver and counts it.
func (s *countingLeases) Complete(ctx context.Context, scope, key, token string, retention time.Duration) error {
	return s.done(key, s.Lease.Complete(ctx, scope, key, token, retention))
}

// CompleteWithResult marks key done with result through the store's driver
// and counts it, as Complete does.
func (s *countingLeases) CompleteWithResult(ctx context.Context, scope, key, token string, retention time.Duration, result []byte) error {
	return s.done(key, s.Lease.CompleteWithResult(ctx, scope, key, token, retention, result))
}
