package sourcetest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/memdedup"
)

// consumerName is the Config.Name of the suite's runners: the scope of their
// deduplication records.
const consumerName = "sourcetest"

// ledger is the merged, ordered log of the store's commits and the runners'
// acknowledgements.
type ledger struct {
	mu      sync.Mutex
	entries []ledgerEntry
	acked   map[string]int // successful acknowledgements per key
}

type ledgerEntry struct {
	commit bool // else: an acknowledgement requested by a runner
	keys   []string
}

func (l *ledger) add(commit bool, keys []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, ledgerEntry{commit: commit, keys: keys})
}

func (l *ledger) ackSucceeded(keys []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.acked == nil {
		l.acked = make(map[string]int)
	}
	for _, k := range keys {
		l.acked[k]++
	}
}

// unacked returns the keys of want never acknowledged successfully.
func (l *ledger) unacked(want []string) map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	missing := make(map[string]bool)
	for _, k := range want {
		if l.acked[k] == 0 {
			missing[k] = true
		}
	}
	return missing
}

// ackBeforeCommit returns a description of every acknowledgement requested
// before a commit had recorded its key.
func (l *ledger) ackBeforeCommit() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	committed := make(map[string]bool)
	var bad []string
	for i, e := range l.entries {
		for _, k := range e.keys {
			switch {
			case e.commit:
				committed[k] = true
			case !committed[k]:
				bad = append(bad, fmt.Sprintf("key %q (ledger entry %d)", k, i))
			}
		}
	}
	return bad
}

// ledgerSource wraps a Source and writes every acknowledgement the runner
// requests into the ledger, before passing it on.
type ledgerSource struct {
	consumer.Source
	led *ledger
	// partialAck: see Features.PartialAck.
	partialAck bool
}

func (s *ledgerSource) Ack(ctx context.Context, msgs []*consumer.Message) error {
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		keys[i], _ = consumer.DefaultKey(m)
	}
	s.led.add(false, keys)
	err := s.Source.Ack(ctx, msgs)
	if err == nil {
		s.led.ackSucceeded(keys)
	} else if s.partialAck && len(msgs) > 1 {
		// Some of the call may be acknowledged: ack each again alone (an
		// acknowledged one is skipped without an error).
		for i, m := range msgs {
			if s.Source.Ack(ctx, []*consumer.Message{m}) == nil {
				s.led.ackSucceeded(keys[i : i+1])
			}
		}
	}
	return err
}

// rig runs consumer.Runners with the transactional path over sources of the
// harness, against one memdedup whose commits and the runners' acks are
// merged into one ledger. Each handler adds 1 to the effect of its key in the
// same transaction as the key's record.
type rig struct {
	t     *testing.T
	store *memdedup.Store
	led   *ledger
	// failFirst makes the first attempt of every failFirst-th key fail, so
	// that retries run through Source.Retry (0: never).
	failFirst int
	// partialAck: see Features.PartialAck.
	partialAck bool
	// work is how long each handler takes.
	work time.Duration

	mu      sync.Mutex
	failed  map[string]bool
	runners []*consumer.Runner
	stops   []func()
}

// newRig returns a rig for the suite's source (Features.PartialAck).
func (s *suite) newRig(t *testing.T) *rig {
	r := &rig{t: t, led: &ledger{}, failed: make(map[string]bool), partialAck: s.h.Features.PartialAck}
	store, err := memdedup.New(memdedup.Config{OnEvent: func(e memdedup.Event) {
		if e.Kind != memdedup.EventCommit {
			return
		}
		keys := make([]string, len(e.Keys))
		for i, k := range e.Keys {
			keys[i] = k.Key
		}
		r.led.add(true, keys)
	}})
	if err != nil {
		t.Fatalf("sourcetest: memdedup: %v", err)
	}
	r.store = store
	t.Cleanup(r.stop)
	return r
}

func effectName(key string) string { return "effect/" + key }

func (r *rig) handle(ctx context.Context, tx *memdedup.Tx, msg *consumer.Message) error {
	if r.work > 0 {
		select {
		case <-time.After(r.work):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if r.failFirst > 0 && r.scriptedFailure(msg.Key) {
		return fmt.Errorf("sourcetest: scripted first failure of %q", msg.Key)
	}
	return tx.Add(effectName(msg.Key), 1)
}

// scriptedFailure reports whether this handler call of key must fail: the
// first call of every failFirst-th key (by its numeric suffix).
func (r *rig) scriptedFailure(key string) bool {
	var n int
	if i := strings.LastIndexByte(key, '-'); i < 0 {
		return false
	} else if _, err := fmt.Sscanf(key[i+1:], "%d", &n); err != nil || n%r.failFirst != 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed[key] {
		return false
	}
	r.failed[key] = true
	return true
}

// start runs a new Runner over src until stop.
func (r *rig) start(src consumer.Source, cfg consumer.Config) *consumer.Runner {
	r.t.Helper()
	cfg.Name = consumerName
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 4
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 5
	}
	cfg.HandlerTimeout = 10 * time.Second
	cfg.DrainTimeout = 10 * time.Second
	cfg.Retry = consumer.RetryPolicy{MaxAttempts: 20, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{r.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	runner, err := consumer.NewRunner(&ledgerSource{Source: src, led: r.led, partialAck: r.partialAck}, consumer.Transactional(r.store, r.handle), cfg)
	if err != nil {
		r.t.Fatalf("sourcetest: NewRunner: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runner.Run(ctx) }()
	r.mu.Lock()
	r.runners = append(r.runners, runner)
	r.stops = append(r.stops, func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				r.t.Errorf("sourcetest: Runner.Run returned %v, want nil after its context was cancelled", err)
			}
		case <-time.After(cfg.DrainTimeout + promptly):
			r.t.Errorf("sourcetest: Runner.Run did not return within %s of its context being cancelled", cfg.DrainTimeout+promptly)
		}
	})
	r.mu.Unlock()
	return runner
}

// stop stops every runner, waiting for each to return. It is idempotent.
func (r *rig) stop() {
	r.mu.Lock()
	stops := r.stops
	r.stops = nil
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, stop := range stops {
		wg.Go(stop)
	}
	wg.Wait()
}

// missing returns the keys of want whose effect is absent or whose
// acknowledgement never succeeded.
func (r *rig) missing(want []string) (noEffect, noAck map[string]bool) {
	values := r.store.Values()
	noEffect = make(map[string]bool)
	for _, k := range want {
		if values[effectName(k)] == 0 {
			noEffect[k] = true
		}
	}
	return noEffect, r.led.unacked(want)
}

// waitDone waits until every key of want has its effect and a successful
// acknowledgement, failing t after timeout.
func (r *rig) waitDone(want []string, timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		noEffect, noAck := r.missing(want)
		if len(noEffect) == 0 && len(noAck) == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.stop()
			r.t.Fatalf("sourcetest: after %s, %d of %d effects are missing (e.g. %v) and %d messages were never acknowledged (e.g. %v); runner stats: %+v",
				timeout, len(noEffect), len(want), sample(noEffect), len(noAck), sample(noAck), r.stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *rig) stats() []consumer.Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]consumer.Stats, len(r.runners))
	for i, rn := range r.runners {
		out[i] = rn.Stats()
	}
	return out
}

// check stops the runners and verifies exactly-once effects for want, that no
// acknowledgement preceded its commit, and that no transaction leaked.
func (r *rig) check(want []string) {
	r.t.Helper()
	r.stop()
	values := r.store.Values()
	wanted := make(map[string]bool, len(want))
	for _, k := range want {
		wanted[k] = true
		if n := values[effectName(k)]; n != 1 {
			r.t.Errorf("sourcetest: effect of key %q applied %d times, want exactly 1", k, n)
		}
	}
	for name, n := range values {
		if !wanted[strings.TrimPrefix(name, "effect/")] {
			r.t.Errorf("sourcetest: unexpected effect %q (applied %d times)", name, n)
		}
	}
	if bad := r.led.ackBeforeCommit(); len(bad) > 0 {
		r.t.Errorf("sourcetest: %d acknowledgement(s) requested before the commit that recorded the key: %v", len(bad), bad[:min(len(bad), 5)])
	}
	if n := r.store.OpenTxs(); n != 0 {
		r.t.Errorf("sourcetest: %d transaction(s) left open after the runners stopped", n)
	}
	for i, st := range r.stats() {
		if st.DeadLettered != 0 {
			r.t.Errorf("sourcetest: runner %d dead-lettered %d message(s); none was poison", i, st.DeadLettered)
		}
	}
}

// testWriter writes a runner's logs to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// withProducerDuplicates returns msgs followed by a second copy of every
// dupEvery-th message (same key and body), as a producer retry would send.
func withProducerDuplicates(msgs []Outgoing, dupEvery int) []Outgoing {
	out := append([]Outgoing(nil), msgs...)
	for i := 0; i < len(msgs); i += dupEvery {
		out = append(out, msgs[i])
	}
	return out
}

// testRunnerAcksAfterCommit runs a consumer.Runner with the transactional path
// over the source and checks that every acknowledgement followed the commit
// of its key and that every effect was applied exactly once, through handler
// failures, failed and unknown-outcome commits, and producer duplicates.
func (s *suite) testRunnerAcksAfterCommit(t *testing.T) {
	n := s.scale(40, 1000)
	topic := s.h.NewTopic(t)
	out := outgoing("runner", n)
	s.h.Publish(t, topic, withProducerDuplicates(out, 7)...)

	r := s.newRig(t)
	r.failFirst = 5
	// The first commit fails; the second is applied but reported as failed.
	r.store.Inject(memdedup.Fault{Kind: memdedup.CommitError})
	r.store.Inject(memdedup.Fault{Kind: memdedup.CommitError, Applied: true})
	r.start(s.open(t, topic), consumer.Config{})
	r.waitDone(keysOf(out), s.runnerTimeout(n))
	r.check(keysOf(out))
}

// testCompetingConsumers runs two Runners, each on its own source on one
// topic, sharing one store, and checks that every effect is applied exactly
// once.
func (s *suite) testCompetingConsumers(t *testing.T) {
	if !s.h.Features.CompetingConsumers {
		t.Skip("sourcetest: Features.CompetingConsumers is false")
	}
	n := 60
	topic := s.h.NewTopic(t)
	out := outgoing("compete", n)
	r := s.newRig(t)
	r.failFirst = 9
	r.work = time.Millisecond
	a := r.start(s.open(t, topic), consumer.Config{Concurrency: 2, BatchSize: 3})
	b := r.start(s.open(t, topic), consumer.Config{Concurrency: 2, BatchSize: 3})
	s.h.Publish(t, topic, withProducerDuplicates(out, 5)...)
	r.waitDone(keysOf(out), s.runnerTimeout(n))
	r.check(keysOf(out))
	t.Logf("sourcetest: runner A received %d, runner B received %d", a.Stats().Received, b.Stats().Received)
}

// testRestart restarts the broker while a Runner consumes, publishes more,
// and checks that every effect is applied exactly once.
func (s *suite) testRestart(t *testing.T) {
	if !s.h.Features.Restart {
		t.Skip("sourcetest: Features.Restart is false")
	}
	n := 60
	topic := s.h.NewTopic(t)
	out := outgoing("restart", n)
	before, after := out[:n/2], out[n/2:]
	r := s.newRig(t)
	r.work = 10 * time.Millisecond
	s.h.Publish(t, topic, before...)
	r.start(s.open(t, topic), consumer.Config{Concurrency: 2, BatchSize: 2})

	// Restart once a few effects are in, while the rest are in flight.
	deadline := time.Now().Add(s.deliveryTimeout())
	for {
		noEffect, _ := r.missing(keysOf(before))
		if len(before)-len(noEffect) >= 5 {
			break
		}
		if time.Now().After(deadline) {
			r.stop()
			t.Fatalf("sourcetest: fewer than 5 of %d messages handled within %s before the restart", len(before), s.deliveryTimeout())
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.h.RestartBroker(t)
	s.h.Publish(t, topic, after...)
	r.waitDone(keysOf(out), s.runnerTimeout(n)+s.redeliveryTimeout())
	r.check(keysOf(out))
}

// runnerTimeout bounds how long Runners may take to handle n messages.
func (s *suite) runnerTimeout(n int) time.Duration {
	return s.deliveryTimeout() + 2*s.redeliveryTimeout() + time.Duration(n)*20*time.Millisecond
}
