package deduptest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// RunTxStore runs the conformance suite of the transactional path against the
// stores newStore returns. newStore is called once per subtest with the
// retention the store must apply (at least one second; the expiry subtest uses two) and must return a
// store on the real server, ready to use (migrated), whose cleanup is
// registered with t.Cleanup. Subtests run in parallel, each on its own scope;
// the concurrent ones hold up to 9 transactions open at once, so the store's
// connection pool must allow a few connections.
func RunTxStore[Tx any](t *testing.T, newStore func(t *testing.T, retention time.Duration) dedupdriver.TxStore[Tx]) {
	t.Helper()
	tests := []struct {
		name      string
		retention time.Duration
		fn        func(t *testing.T, s dedupdriver.Tx[Tx])
	}{
		{"DuplicateAcrossTransactions", time.Hour, txDuplicates[Tx]},
		{"RollbackLeavesNoRecord", time.Hour, txRollback[Tx]},
		{"PayloadMismatch", time.Hour, txMismatch[Tx]},
		{"BatchRerunWithoutCulprit", time.Hour, txBatchRerun[Tx]},
		{"BeginClaim", time.Hour, txBeginClaim[Tx]},
		{"CommitChain", time.Hour, txCommitChain[Tx]},
		{"ConcurrentClaimRace", time.Hour, txRace[Tx]},
		{"ConcurrentClaimRaceWinnerRollsBack", time.Hour, txRaceRollback[Tx]},
		{"NoDeadlockAcrossKeyOrders", time.Hour, txKeyOrders[Tx]},
		{"RetentionExpiry", txRetention, txExpiry[Tx]},
		{"ScopesAndKeysAreSeparate", time.Hour, txScopes[Tx]},
		{"LargeBatch", time.Hour, txLargeBatch[Tx]},
		{"Results", time.Hour, txResults[Tx]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t, tc.retention).Driver())
		})
	}
}

// txRetention is the retention of the expiry subtest.
const txRetention = 2 * time.Second

// txHold is how long a winning transaction keeps its claim open before it
// ends, so that the concurrent claims really wait for it.
const txHold = 100 * time.Millisecond

// inTx runs fn in a new transaction and commits it if commit is true, else
// rolls it back. It fails t on any store error.
func inTx[Tx any](ctx context.Context, t *testing.T, s dedupdriver.Tx[Tx], commit bool, fn func(tx Tx)) {
	t.Helper()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	defer s.Rollback(context.WithoutCancel(ctx), tx) // safe after Commit
	fn(tx)
	if !commit {
		if err := s.Rollback(ctx, tx); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		return
	}
	if err := s.Commit(ctx, tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

// claimIn claims recs in tx and checks that the answer has one claim per
// record, in the order of recs.
func claimIn[Tx any](ctx context.Context, t *testing.T, s dedupdriver.Tx[Tx], tx Tx, scope string, recs ...dedup.Record) []dedup.Claim {
	t.Helper()
	cs, err := s.Claim(ctx, tx, scope, recs)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	wantClaimsOf(t, "Claim", recs, cs)
	return cs
}

// wantClaimsOf fails t unless cs, returned by the claim op, hold one claim
// per record, in the order of recs.
func wantClaimsOf(t *testing.T, op string, recs []dedup.Record, cs []dedup.Claim) {
	t.Helper()
	if len(cs) != len(recs) {
		t.Fatalf("%s of %d records returned %d claims", op, len(recs), len(cs))
	}
	for i := range recs {
		if cs[i].Key != recs[i].Key {
			t.Fatalf("%s result %d is for key %q, want %q (results must follow the order of the records)", op, i, cs[i].Key, recs[i].Key)
		}
	}
}

// claimCommitted claims recs in a transaction of its own and commits.
func claimCommitted[Tx any](ctx context.Context, t *testing.T, s dedupdriver.Tx[Tx], scope string, recs ...dedup.Record) []dedup.Claim {
	t.Helper()
	var cs []dedup.Claim
	inTx(ctx, t, s, true, func(tx Tx) { cs = claimIn(ctx, t, s, tx, scope, recs...) })
	return cs
}

// peek claims recs in a transaction that it rolls back, to see their state
// without recording anything.
func peek[Tx any](ctx context.Context, t *testing.T, s dedupdriver.Tx[Tx], scope string, recs ...dedup.Record) []dedup.Claim {
	t.Helper()
	var cs []dedup.Claim
	inTx(ctx, t, s, false, func(tx Tx) { cs = claimIn(ctx, t, s, tx, scope, recs...) })
	return cs
}

// wantStates compares the states of cs with want, one per claim.
func wantStates(t *testing.T, what string, cs []dedup.Claim, want ...dedup.State) {
	t.Helper()
	for i, c := range cs {
		if c.State != want[i] {
			t.Fatalf("%s: key %q is %v, want %v (all: %s)", what, c.Key, c.State, want[i], describe(cs))
		}
	}
}

func describe(cs []dedup.Claim) string {
	s := ""
	for i, c := range cs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s=%v", c.Key, c.State)
	}
	return s
}

const (
	sNew      = dedup.StateNew
	sDone     = dedup.StateDone
	sMismatch = dedup.StateMismatch
)

func txDuplicates[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	wantStates(t, "first claim", claimCommitted(ctx, t, s, scope, rec("b", h), rec("a", h)), sNew, sNew)

	cs := claimCommitted(ctx, t, s, scope, rec("c", h), rec("a", h), rec("b", h))
	wantStates(t, "second claim", cs, sNew, sDone, sDone)
	for _, c := range cs[1:] {
		if c.StoredHash != h || c.ProcessedAt.IsZero() {
			t.Fatalf("duplicate %q: StoredHash %s, ProcessedAt %v; want the recorded hash and a time", c.Key, c.StoredHash.Short(), c.ProcessedAt)
		}
	}
	wantStates(t, "third claim", peek(ctx, t, s, scope, rec("a", h), rec("b", h), rec("c", h)), sDone, sDone, sDone)
}

func txRollback[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	// A failed handler's transaction rolls back: its retry is new again.
	for range 3 {
		wantStates(t, "claim after rollback", peek(ctx, t, s, scope, rec("k", h)), sNew)
	}
	wantStates(t, "claim that commits", claimCommitted(ctx, t, s, scope, rec("k", h)), sNew)
	wantStates(t, "claim after commit", peek(ctx, t, s, scope, rec("k", h)), sDone)
}

func txMismatch[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	ctx := testContext(t)
	scope, h1, h2 := newScope(t), payload("one"), payload("two")
	claimCommitted(ctx, t, s, scope, rec("k", h1))

	cs := claimCommitted(ctx, t, s, scope, rec("k", h2), rec("other", h2))
	wantStates(t, "different payload", cs, sMismatch, sNew)
	if cs[0].StoredHash != h1 {
		t.Fatalf("mismatch: StoredHash %s, want %s", cs[0].StoredHash.Short(), h1.Short())
	}
	// The mismatch changed nothing: the original payload is still done.
	wantStates(t, "original payload", peek(ctx, t, s, scope, rec("k", h1)), sDone)
}

// txBatchRerun drives a batch the way the runner does when a handler fails:
// the whole transaction rolls back, and the batch runs again without the
// culprit and commits.
func txBatchRerun[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	inTx(ctx, t, s, false, func(tx Tx) {
		wantStates(t, "batch claim", claimIn(ctx, t, s, tx, scope, rec("a", h), rec("b", h), rec("c", h)), sNew, sNew, sNew)
	})
	wantStates(t, "rerun without b", claimCommitted(ctx, t, s, scope, rec("a", h), rec("c", h)), sNew, sNew)
	wantStates(t, "after the batch", peek(ctx, t, s, scope, rec("a", h), rec("b", h), rec("c", h)), sDone, sNew, sDone)
}

// txBeginClaim checks a store's pipelined BeginClaim, if it has one: the
// same answers as Claim, and a transaction that commits or rolls back like
// one from Begin.
func txBeginClaim[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	bc := s
	if !s.Caps().BeginClaim {
		t.Skip("the store has no BeginClaim")
	}
	ctx := testContext(t)
	scope, h, other := newScope(t), payload("a"), payload("other")
	claimCommitted(ctx, t, s, scope, rec("done", h), rec("changed", h))
	beginClaim := func(commit bool, recs ...dedup.Record) []dedup.Claim {
		t.Helper()
		tx, cs, err := bc.BeginClaim(ctx, scope, recs)
		if err != nil {
			t.Fatalf("BeginClaim: %v", err)
		}
		defer s.Rollback(context.WithoutCancel(ctx), tx) // safe after Commit
		wantClaimsOf(t, "BeginClaim", recs, cs)
		if commit {
			if err := s.Commit(ctx, tx); err != nil {
				t.Fatalf("Commit: %v", err)
			}
		} else if err := s.Rollback(ctx, tx); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		return cs
	}
	recs := []dedup.Record{rec("new", h), rec("done", h), rec("changed", other), rec("new2", h)}
	wantStates(t, "BeginClaim rolled back", beginClaim(false, recs...), sNew, sDone, sMismatch, sNew)
	wantStates(t, "after the rollback", peek(ctx, t, s, scope, rec("new", h), rec("new2", h)), sNew, sNew)
	wantStates(t, "BeginClaim committed", beginClaim(true, recs...), sNew, sDone, sMismatch, sNew)
	wantStates(t, "after the commit", peek(ctx, t, s, scope, rec("new", h), rec("new2", h)), sDone, sDone)
	for range 3 { // the connection goes back to the pool in a clean state
		wantStates(t, "BeginClaim again", beginClaim(false, rec("new", h), rec("fresh", h)), sDone, sNew)
	}
}

// txCommitChain checks a store's CommitChain, if it has one: the commit is
// durable, the chained claim answers as Claim would (a key of the
// transaction just committed is done), the chained transaction commits and
// rolls back like one from Begin, and a chain can run many times over.
func txCommitChain[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	cc := s
	if !s.Caps().CommitChain {
		t.Skip("the store has no CommitChain")
	}
	ctx := testContext(t)
	scope, h, other := newScope(t), payload("a"), payload("other")
	claimCommitted(ctx, t, s, scope, rec("changed", h))
	chain := func(tx Tx, recs ...dedup.Record) []dedup.Claim {
		t.Helper()
		cs, committed, err := cc.CommitChain(ctx, tx, scope, recs)
		if err != nil || !committed {
			t.Fatalf("CommitChain: committed %v, %v", committed, err)
		}
		wantClaimsOf(t, "CommitChain", recs, cs)
		return cs
	}
	for range 3 { // the connection goes back to the pool in a clean state
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatalf("Begin: %v", err)
		}
		wantStates(t, "first claim", claimIn(ctx, t, s, tx, scope, rec("a", h)), sNew)
		wantStates(t, "chained after a", chain(tx, rec("a", h), rec("b", h), rec("changed", other)), sDone, sNew, sMismatch)
		wantStates(t, "chained after b", chain(tx, rec("b", h), rec("c", h)), sDone, sNew)
		if err := s.Rollback(ctx, tx); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		wantStates(t, "after the rollback", peek(ctx, t, s, scope, rec("a", h), rec("b", h), rec("c", h)), sDone, sDone, sNew)
		scope = newScope(t)
		claimCommitted(ctx, t, s, scope, rec("changed", h))
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	defer s.Rollback(context.WithoutCancel(ctx), tx) // safe after Commit
	claimIn(ctx, t, s, tx, scope, rec("x", h))
	wantStates(t, "chained after x", chain(tx, rec("y", h)), sNew)
	if err := s.Commit(ctx, tx); err != nil {
		t.Fatalf("Commit of the chained transaction: %v", err)
	}
	wantStates(t, "after the commit", peek(ctx, t, s, scope, rec("x", h), rec("y", h)), sDone, sDone)
}

// txContend lets n goroutines claim recs in their own transactions at once.
// decide is called with each goroutine's claims while its transaction is
// open and says whether to commit it. The winner of a key holds it for
// txHold before deciding, so the others really wait.
func txContend[Tx any](ctx context.Context, t *testing.T, s dedupdriver.Tx[Tx], scope string, n int,
	recsOf func(i int) []dedup.Record, decide func(cs []dedup.Claim) bool) [][]dedup.Claim {
	t.Helper()
	results, errs := make([][]dedup.Claim, n), make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = contendOne(ctx, s, scope, recsOf(i), decide)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent transactions: %v", err)
	}
	return results
}

func contendOne[Tx any](ctx context.Context, s dedupdriver.Tx[Tx], scope string, recs []dedup.Record, decide func([]dedup.Claim) bool) ([]dedup.Claim, error) {
	tx, err := s.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer s.Rollback(context.WithoutCancel(ctx), tx) // safe after Commit
	cs, err := s.Claim(ctx, tx, scope, recs)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	if len(cs) != len(recs) {
		return nil, fmt.Errorf("claim of %d records returned %d claims", len(recs), len(cs))
	}
	for _, c := range cs {
		if c.State == dedup.StateNew {
			time.Sleep(txHold)
			break
		}
	}
	if decide(cs) {
		if err := s.Commit(ctx, tx); err != nil {
			return nil, fmt.Errorf("commit: %w", err)
		}
		return cs, nil
	}
	if err := s.Rollback(ctx, tx); err != nil {
		return nil, fmt.Errorf("rollback: %w", err)
	}
	return cs, nil
}

// tally counts the states of key k in the results of txContend.
func tally(results [][]dedup.Claim, k int) map[dedup.State]int {
	m := make(map[dedup.State]int)
	for _, cs := range results {
		m[cs[k].State]++
	}
	return m
}

const raceGoroutines = 8

func txRace[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	results := txContend(ctx, t, s, scope, raceGoroutines,
		func(int) []dedup.Record { return []dedup.Record{rec("k", h)} },
		func([]dedup.Claim) bool { return true })
	if got := tally(results, 0); got[sNew] != 1 || got[sDone] != raceGoroutines-1 {
		t.Fatalf("%d transactions claiming one key: %v, want exactly one new and the rest done", raceGoroutines, got)
	}
}

func txRaceRollback[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	var rolledBack atomic.Bool
	results := txContend(ctx, t, s, scope, raceGoroutines,
		func(int) []dedup.Record { return []dedup.Record{rec("k", h)} },
		func(cs []dedup.Claim) bool {
			// The first winner's handler fails: its transaction rolls
			// back, and exactly one waiter must get the key instead.
			return cs[0].State != dedup.StateNew || !rolledBack.CompareAndSwap(false, true)
		})
	if got := tally(results, 0); got[sNew] != 2 || got[sDone] != raceGoroutines-2 {
		t.Fatalf("%d transactions claiming one key, the first winner rolling back: %v, want exactly two new (the rolled-back winner and its successor) and the rest done",
			raceGoroutines, got)
	}
	wantStates(t, "after the race", peek(ctx, t, s, scope, rec("k", h)), sDone)
}

func txKeyOrders[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	keys := []string{"k1", "k2", "k3", "k4", "k5"}
	orders := make([][]string, raceGoroutines)
	for i := range orders {
		orders[i] = append([]string(nil), keys...)
		rand.Shuffle(len(keys), func(a, b int) { orders[i][a], orders[i][b] = orders[i][b], orders[i][a] })
	}
	results := txContend(ctx, t, s, scope, raceGoroutines,
		func(i int) []dedup.Record {
			recs := make([]dedup.Record, len(keys))
			for j, k := range orders[i] {
				recs[j] = rec(k, h)
			}
			return recs
		},
		func([]dedup.Claim) bool { return true })
	wins := make(map[string]int)
	for _, cs := range results {
		for _, c := range cs {
			if c.State == dedup.StateNew {
				wins[c.Key]++
			} else if c.State != dedup.StateDone {
				t.Fatalf("key %q: state %v, want new or done", c.Key, c.State)
			}
		}
	}
	for _, k := range keys {
		if wins[k] != 1 {
			t.Fatalf("batches claiming the same keys in different orders: %q won %d times, want once (all wins: %v)", k, wins[k], wins)
		}
	}
}

func txExpiry[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	claimCommitted(ctx, t, s, scope, rec("k", h))
	wantStates(t, "right after commit", peek(ctx, t, s, scope, rec("k", h)), sDone)

	var last []dedup.Claim
	if !eventually(ctx, txRetention+expiryGrace, func() bool {
		last = peek(ctx, t, s, scope, rec("k", h))
		return last[0].State == dedup.StateNew
	}) {
		t.Fatalf("record with retention %v was never forgotten: %s", txRetention, describe(last))
	}
	wantStates(t, "claim after expiry", claimCommitted(ctx, t, s, scope, rec("k", h)), sNew)
	wantStates(t, "claim after the new record", peek(ctx, t, s, scope, rec("k", h)), sDone)
}

func txScopes[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	ctx := testContext(t)
	base, h := newScope(t), payload("a")
	pairs := []struct{ scope, key string }{
		{base + ":x", "y"},
		{base, "x:y"},
		{base + "-other", "x:y"},
		{base, "ключ ✓ '\"; --"},
	}
	for _, p := range pairs {
		wantStates(t, "first claim", claimCommitted(ctx, t, s, p.scope, rec(p.key, h)), sNew)
	}
	for _, p := range pairs {
		wantStates(t, "second claim", peek(ctx, t, s, p.scope, rec(p.key, h)), sDone)
	}
	wantStates(t, "fresh scope", peek(ctx, t, s, base+"-fresh", rec("x:y", h)), sNew)
}

func txLargeBatch[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	const n = 500
	recs := make([]dedup.Record, n)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("k%04d", (i*7919)%n), h) // a permutation, not sorted
	}
	wantAll := func(st dedup.State) []dedup.State {
		out := make([]dedup.State, n)
		for i := range out {
			out[i] = st
		}
		return out
	}
	wantStates(t, "first batch", claimCommitted(ctx, t, s, scope, recs[:n/2]...), wantAll(sNew)...)
	cs := peek(ctx, t, s, scope, recs...)
	wantStates(t, "second batch, first half", cs[:n/2], wantAll(sDone)...)
	wantStates(t, "second batch, second half", cs[n/2:], wantAll(sNew)...)
}

// txResults: a result stored with a record (dedupdriver.Caps.Results) commits with
// it and comes back, byte for byte, with the duplicate verdict; a record
// without one comes back with a nil Result; a rolled-back result is gone with
// its record; a different payload is still a mismatch, and an expired record
// claimed anew has no result. Stores without it skip it.
func txResults[Tx any](t *testing.T, s dedupdriver.Tx[Tx]) {
	rs := s
	if !s.Caps().Results {
		t.Skipf("%T keeps no results", s)
	}
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	big := make([]byte, 64<<10)
	for i := range big {
		big[i] = byte(i * 7)
	}
	results := map[string][]byte{"r1": []byte("charge 1\x00\xff\n"), "r2": {}, "big": big}
	inTx(ctx, t, s, true, func(tx Tx) {
		wantStates(t, "first claim", claimIn(ctx, t, s, tx, scope, rec("r1", h), rec("r2", h), rec("big", h), rec("none", h)), sNew, sNew, sNew, sNew)
		var rr []dedup.Result
		for _, k := range []string{"r1", "r2", "big"} {
			rr = append(rr, dedup.Result{Key: k, Value: results[k]})
		}
		if err := rs.StoreResults(ctx, tx, scope, rr); err != nil {
			t.Fatalf("StoreResults: %v", err)
		}
	})
	inTx(ctx, t, s, false, func(tx Tx) {
		wantStates(t, "rolled back claim", claimIn(ctx, t, s, tx, scope, rec("gone", h)), sNew)
		if err := rs.StoreResults(ctx, tx, scope, []dedup.Result{{Key: "gone", Value: []byte("x")}}); err != nil {
			t.Fatalf("StoreResults: %v", err)
		}
	})

	cs := peek(ctx, t, s, scope, rec("r1", h), rec("r2", h), rec("big", h), rec("none", h), rec("gone", h))
	wantStates(t, "second claim", cs, sDone, sDone, sDone, sDone, sNew)
	for _, c := range cs[:3] {
		if want := results[c.Key]; !bytes.Equal(c.Result, want) {
			t.Errorf("duplicate %q: Result of %d bytes, want the %d stored", c.Key, len(c.Result), len(want))
		}
	}
	if cs[3].Result != nil || cs[4].Result != nil {
		t.Errorf("Result without a stored one: %q and %q, want nil", cs[3].Result, cs[4].Result)
	}
	if cs := peek(ctx, t, s, scope, rec("r1", payload("b"))); cs[0].State != sMismatch || cs[0].Result != nil {
		t.Errorf("different payload: %v with Result %q, want a mismatch without the result", cs[0].State, cs[0].Result)
	}
	if ins, ok := s.(interface {
		Inspect(ctx context.Context, scope, key string) (dedup.Entry, error)
	}); ok {
		e, err := ins.Inspect(ctx, scope, "r1")
		if err != nil || !bytes.Equal(e.Result, results["r1"]) {
			t.Errorf("Inspect = %q, %v; want the stored result", e.Result, err)
		}
	}
}
