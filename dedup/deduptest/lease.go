package deduptest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// RunLeaseStore runs the conformance suite of the lease path against the
// stores newStore returns. newStore is called once per subtest and must
// return a store on the real server; it registers the store's cleanup with
// t.Cleanup. Subtests run in parallel, each on its own scope.
func RunLeaseStore(t *testing.T, newStore func(t *testing.T) dedupdriver.LeaseStore) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s dedupdriver.Lease)
	}{
		{"ClaimThenInProgress", leaseClaimThenInProgress},
		{"CompleteThenDuplicate", leaseCompleteThenDuplicate},
		{"PayloadMismatch", leasePayloadMismatch},
		{"AbandonOnFailure", leaseReleaseOnFailure},
		{"TokenGuards", leaseTokenGuards},
		{"LeaseExpiry", leaseExpiry},
		{"RefreshKeepsLease", leaseRefreshKeeps},
		{"RetentionExpiry", leaseRetentionExpiry},
		{"ConcurrentClaimRace", leaseConcurrentRace},
		{"RaceAfterExpiry", leaseRaceAfterExpiry},
		{"ScopesAndKeysAreSeparate", leaseScopesSeparate},
		{"InspectNotFound", leaseInspectNotFound},
		{"Results", leaseResults},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t).Driver())
		})
	}
}

// Leases long enough never to expire during a subtest.
const longLease = time.Minute

func claim(ctx context.Context, t *testing.T, s dedupdriver.Lease, scope string, r dedup.Record, token string, lease time.Duration) dedup.Claim {
	t.Helper()
	c, err := s.Claim(ctx, scope, r, token, lease)
	if err != nil {
		t.Fatalf("Claim(%q, token %s): %v", r.Key, token[:8], err)
	}
	if c.Key != r.Key {
		t.Fatalf("Claim(%q).Key = %q", r.Key, c.Key)
	}
	return c
}

func wantState(t *testing.T, c dedup.Claim, want dedup.State) {
	t.Helper()
	if c.State != want {
		t.Fatalf("claim of %q: state %v, want %v", c.Key, c.State, want)
	}
}

func wantLost(t *testing.T, op string, err error) {
	t.Helper()
	if !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("%s with a token that does not hold the key: err = %v, want dedup.ErrLeaseLost", op, err)
	}
}

func mustNil(t *testing.T, op string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
}

func leaseClaimThenInProgress(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	before := time.Now()
	wantState(t, claim(ctx, t, s, scope, rec("k", h), newToken(), longLease), dedup.StateNew)

	e, err := s.Inspect(ctx, scope, "k")
	mustNil(t, "Inspect", err)
	if !e.InProgress || e.PayloadHash != h || e.Key != "k" || e.Scope != scope {
		t.Fatalf("Inspect of a held key = %+v, want in progress with the claimed payload hash", e)
	}
	if !e.LeaseUntil.After(before) {
		t.Fatalf("Inspect: LeaseUntil %v is not after the claim (%v)", e.LeaseUntil, before)
	}

	c := claim(ctx, t, s, scope, rec("k", h), newToken(), longLease)
	wantState(t, c, dedup.StateInProgress)
	if !c.StoredHash.IsZero() && c.StoredHash != h {
		t.Fatalf("in-progress claim: StoredHash %s, want %s or zero", c.StoredHash.Short(), h.Short())
	}
}

func leaseCompleteThenDuplicate(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	tok := newToken()
	wantState(t, claim(ctx, t, s, scope, rec("k", h), tok, longLease), dedup.StateNew)
	mustNil(t, "Complete", s.Complete(ctx, scope, "k", tok, time.Hour))

	for range 3 { // every later delivery is a duplicate
		c := claim(ctx, t, s, scope, rec("k", h), newToken(), longLease)
		wantState(t, c, dedup.StateDone)
		if c.StoredHash != h {
			t.Fatalf("done claim: StoredHash %s, want %s", c.StoredHash.Short(), h.Short())
		}
		if c.ProcessedAt.IsZero() {
			t.Fatal("done claim: ProcessedAt is zero")
		}
	}
	e, err := s.Inspect(ctx, scope, "k")
	mustNil(t, "Inspect", err)
	if e.InProgress || e.PayloadHash != h || e.ProcessedAt.IsZero() || !e.ExpiresAt.After(e.ProcessedAt) {
		t.Fatalf("Inspect of a done key = %+v, want done, with the payload hash, expiring after ProcessedAt", e)
	}

	// A done key can be neither refreshed, completed again by another token,
	// nor released.
	other := newToken()
	wantLost(t, "Complete", s.Complete(ctx, scope, "k", other, time.Hour))
	wantLost(t, "Refresh", s.Refresh(ctx, scope, "k", tok, longLease))
	mustNil(t, "Abandon of a done key", s.Abandon(ctx, scope, "k", tok))
	wantState(t, claim(ctx, t, s, scope, rec("k", h), newToken(), longLease), dedup.StateDone)
}

func leasePayloadMismatch(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	scope, h1, h2 := newScope(t), payload("one"), payload("two")
	tok := newToken()
	wantState(t, claim(ctx, t, s, scope, rec("k", h1), tok, longLease), dedup.StateNew)

	// While in progress, a store may report the mismatch at once (it knows
	// the holder's payload) or report the key in progress (the retry then
	// sees the mismatch once the key is done). Either way the second payload
	// does not run.
	c := claim(ctx, t, s, scope, rec("k", h2), newToken(), longLease)
	switch c.State {
	case dedup.StateMismatch:
		if c.StoredHash != h1 {
			t.Fatalf("mismatch while in progress: StoredHash %s, want %s", c.StoredHash.Short(), h1.Short())
		}
	case dedup.StateInProgress:
	default:
		t.Fatalf("claim with another payload while in progress: state %v, want mismatch or in progress", c.State)
	}

	// After done.
	mustNil(t, "Complete", s.Complete(ctx, scope, "k", tok, time.Hour))
	c = claim(ctx, t, s, scope, rec("k", h2), newToken(), longLease)
	wantState(t, c, dedup.StateMismatch)
	if c.StoredHash != h1 {
		t.Fatalf("mismatch after done: StoredHash %s, want %s", c.StoredHash.Short(), h1.Short())
	}
	// The mismatch changed nothing: the original payload is still done.
	wantState(t, claim(ctx, t, s, scope, rec("k", h1), newToken(), longLease), dedup.StateDone)
}

func leaseReleaseOnFailure(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	tok1, tok2 := newToken(), newToken()
	wantState(t, claim(ctx, t, s, scope, rec("k", h), tok1, longLease), dedup.StateNew)
	mustNil(t, "Abandon", s.Abandon(ctx, scope, "k", tok1))

	// The retry claims the key at once, without waiting for the lease.
	wantState(t, claim(ctx, t, s, scope, rec("k", h), tok2, longLease), dedup.StateNew)

	// A stale release by the first token changes nothing.
	mustNil(t, "stale Abandon", s.Abandon(ctx, scope, "k", tok1))
	wantState(t, claim(ctx, t, s, scope, rec("k", h), newToken(), longLease), dedup.StateInProgress)
	mustNil(t, "Complete", s.Complete(ctx, scope, "k", tok2, time.Hour))
	wantState(t, claim(ctx, t, s, scope, rec("k", h), newToken(), longLease), dedup.StateDone)
}

func leaseTokenGuards(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	tok, other := newToken(), newToken()
	wantState(t, claim(ctx, t, s, scope, rec("k", h), tok, longLease), dedup.StateNew)

	wantLost(t, "Refresh", s.Refresh(ctx, scope, "k", other, longLease))
	wantLost(t, "Complete", s.Complete(ctx, scope, "k", other, time.Hour))
	mustNil(t, "Abandon by another token", s.Abandon(ctx, scope, "k", other))
	wantState(t, claim(ctx, t, s, scope, rec("k", h), newToken(), longLease), dedup.StateInProgress)

	// A key nobody holds cannot be refreshed or completed either.
	wantLost(t, "Refresh of an unknown key", s.Refresh(ctx, scope, "unknown", tok, longLease))
	wantLost(t, "Complete of an unknown key", s.Complete(ctx, scope, "unknown", tok, time.Hour))
	wantState(t, claim(ctx, t, s, scope, rec("unknown", h), newToken(), longLease), dedup.StateNew)

	mustNil(t, "Refresh by the holder", s.Refresh(ctx, scope, "k", tok, longLease))
	mustNil(t, "Complete by the holder", s.Complete(ctx, scope, "k", tok, time.Hour))
}

func leaseExpiry(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	stale, next := newToken(), newToken()
	const lease = 200 * time.Millisecond
	wantState(t, claim(ctx, t, s, scope, rec("k", h), stale, lease), dedup.StateNew)

	// The holder "crashed": nobody refreshes. Another worker gets the key
	// once the lease is over.
	var last dedup.Claim
	ok := eventually(ctx, lease+expiryGrace, func() bool {
		last = claim(ctx, t, s, scope, rec("k", h), next, longLease)
		return last.State == dedup.StateNew
	})
	if !ok {
		t.Fatalf("lease of %v never expired: last claim state %v", lease, last.State)
	}

	// The stale holder can no longer touch the key.
	wantLost(t, "Refresh by the expired token", s.Refresh(ctx, scope, "k", stale, longLease))
	wantLost(t, "Complete by the expired token", s.Complete(ctx, scope, "k", stale, time.Hour))
	mustNil(t, "Abandon by the expired token", s.Abandon(ctx, scope, "k", stale))
	wantState(t, claim(ctx, t, s, scope, rec("k", h), newToken(), longLease), dedup.StateInProgress)

	mustNil(t, "Complete by the new holder", s.Complete(ctx, scope, "k", next, time.Hour))
	wantState(t, claim(ctx, t, s, scope, rec("k", h), newToken(), longLease), dedup.StateDone)
}

func leaseRefreshKeeps(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	tok := newToken()
	const lease, every, rounds = 1500 * time.Millisecond, 250 * time.Millisecond, 8 // 2 s > lease
	wantState(t, claim(ctx, t, s, scope, rec("k", h), tok, lease), dedup.StateNew)
	for i := range rounds {
		time.Sleep(every)
		if err := s.Refresh(ctx, scope, "k", tok, lease); err != nil {
			t.Fatalf("Refresh %d by the holder: %v", i, err)
		}
		wantState(t, claim(ctx, t, s, scope, rec("k", h), newToken(), lease), dedup.StateInProgress)
	}
	mustNil(t, "Complete after refreshes", s.Complete(ctx, scope, "k", tok, time.Hour))
}

func leaseRetentionExpiry(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	tok := newToken()
	const retention = 300 * time.Millisecond
	wantState(t, claim(ctx, t, s, scope, rec("k", h), tok, longLease), dedup.StateNew)
	mustNil(t, "Complete", s.Complete(ctx, scope, "k", tok, retention))

	var last dedup.Claim
	ok := eventually(ctx, retention+expiryGrace, func() bool {
		tok := newToken()
		last = claim(ctx, t, s, scope, rec("k", h), tok, longLease)
		if last.State == dedup.StateNew {
			return true
		}
		if last.State != dedup.StateDone {
			t.Fatalf("claim of a retained key: state %v, want done (or new once forgotten)", last.State)
		}
		return false
	})
	if !ok {
		t.Fatalf("record with retention %v was never forgotten: last claim state %v", retention, last.State)
	}
	if _, err := s.Inspect(ctx, scope, "k"); err != nil {
		t.Fatalf("Inspect after the new claim: %v", err)
	}
}

// race lets n goroutines claim one key at the same moment, each with its own
// token, and returns the states they saw and their tokens.
func race(t *testing.T, s dedupdriver.Lease, scope string, r dedup.Record, n int) ([]dedup.State, []string) {
	t.Helper()
	ctx := testContext(t)
	states, tokens, errs := make([]dedup.State, n), make([]string, n), make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		tokens[i] = newToken()
		wg.Go(func() {
			<-start
			c, err := s.Claim(ctx, scope, r, tokens[i], longLease)
			states[i], errs[i] = c.State, err
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent claims: %v", err)
	}
	return states, tokens
}

func count(states []dedup.State) map[dedup.State]int {
	m := make(map[dedup.State]int)
	for _, s := range states {
		m[s]++
	}
	return m
}

func leaseConcurrentRace(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	const goroutines, keys = 32, 5
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		states, tokens := race(t, s, scope, rec(key, h), goroutines)
		got := count(states)
		if got[dedup.StateNew] != 1 || got[dedup.StateInProgress] != goroutines-1 {
			t.Fatalf("%d concurrent claims of %q: %v, want exactly one new and the rest in progress", goroutines, key, got)
		}
		for i, st := range states {
			if st == dedup.StateNew {
				mustNil(t, "Complete by the winner", s.Complete(ctx, scope, key, tokens[i], time.Hour))
			}
		}
		states, _ = race(t, s, scope, rec(key, h), goroutines)
		if got := count(states); got[dedup.StateDone] != goroutines {
			t.Fatalf("%d concurrent claims of done key %q: %v, want all done", goroutines, key, got)
		}
	}
}

func leaseRaceAfterExpiry(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	const lease, goroutines = 150 * time.Millisecond, 16
	wantState(t, claim(ctx, t, s, scope, rec("k", h), newToken(), lease), dedup.StateNew)
	// Wait until the crashed holder's lease is gone, then let the
	// redeliveries race for it.
	if !eventually(ctx, lease+expiryGrace, func() bool {
		_, err := s.Inspect(ctx, scope, "k")
		if err != nil && !errors.Is(err, dedup.ErrNotFound) {
			t.Fatalf("Inspect: %v", err)
		}
		return errors.Is(err, dedup.ErrNotFound)
	}) {
		t.Fatal("expired lease still visible to Inspect")
	}
	states, _ := race(t, s, scope, rec("k", h), goroutines)
	if got := count(states); got[dedup.StateNew] != 1 || got[dedup.StateInProgress] != goroutines-1 {
		t.Fatalf("%d claims racing for an expired lease: %v, want exactly one new", goroutines, got)
	}
}

func leaseScopesSeparate(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	base, h := newScope(t), payload("a")
	// Pairs that a naive "scope:key" encoding would confuse, and keys with
	// characters that have a meaning in some stores' key syntax.
	pairs := []struct{ scope, key string }{
		{base + ":x", "y"},
		{base, "x:y"},
		{base + "{x", "y}"},
		{base, "{x}:y"},
		{base + "%3A", "x"},
		{base, "%3A:x"},
		{base + "-other", "x:y"},
		{base, "ключ ✓"},
	}
	for _, p := range pairs {
		tok := newToken()
		wantState(t, claim(ctx, t, s, p.scope, rec(p.key, h), tok, longLease), dedup.StateNew)
		mustNil(t, "Complete", s.Complete(ctx, p.scope, p.key, tok, time.Hour))
	}
	for _, p := range pairs {
		wantState(t, claim(ctx, t, s, p.scope, rec(p.key, h), newToken(), longLease), dedup.StateDone)
		e, err := s.Inspect(ctx, p.scope, p.key)
		mustNil(t, "Inspect", err)
		if e.Scope != p.scope || e.Key != p.key {
			t.Fatalf("Inspect(%q, %q) returned scope %q key %q", p.scope, p.key, e.Scope, e.Key)
		}
	}
	wantState(t, claim(ctx, t, s, base+"-fresh", rec("x:y", h), newToken(), longLease), dedup.StateNew)
}

func leaseInspectNotFound(t *testing.T, s dedupdriver.Lease) {
	ctx := testContext(t)
	_, err := s.Inspect(ctx, newScope(t), "never-claimed")
	if !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("Inspect of an unknown key: err = %v, want dedup.ErrNotFound", err)
	}
}

// leaseResults: a result stored with CompleteWithResult (dedupdriver.Caps.Results)
// comes back with every duplicate verdict and from Inspect; a key completed
// without one has a nil Result; a different payload is a mismatch without it.
// Stores without it skip it.
func leaseResults(t *testing.T, s dedupdriver.Lease) {
	rc := s
	if !s.Caps().Results {
		t.Skipf("%T keeps no results", s)
	}
	ctx := testContext(t)
	scope, h := newScope(t), payload("a")
	want := []byte("sent \x00\xff id=42")
	tok := newToken()
	wantState(t, claim(ctx, t, s, scope, rec("k", h), tok, longLease), dedup.StateNew)
	mustNil(t, "CompleteWithResult", rc.CompleteWithResult(ctx, scope, "k", tok, time.Hour, want))
	tok2 := newToken()
	wantState(t, claim(ctx, t, s, scope, rec("plain", h), tok2, longLease), dedup.StateNew)
	mustNil(t, "Complete", s.Complete(ctx, scope, "plain", tok2, time.Hour))

	for range 2 {
		c := claim(ctx, t, s, scope, rec("k", h), newToken(), longLease)
		wantState(t, c, dedup.StateDone)
		if !bytes.Equal(c.Result, want) {
			t.Fatalf("done claim: Result %q, want %q", c.Result, want)
		}
	}
	if c := claim(ctx, t, s, scope, rec("plain", h), newToken(), longLease); c.State != dedup.StateDone || c.Result != nil {
		t.Fatalf("done claim without a result: %v, Result %q; want done, nil", c.State, c.Result)
	}
	if c := claim(ctx, t, s, scope, rec("k", payload("b")), newToken(), longLease); c.State != dedup.StateMismatch || c.Result != nil {
		t.Fatalf("different payload: %v, Result %q; want a mismatch without the result", c.State, c.Result)
	}
	e, err := s.Inspect(ctx, scope, "k")
	mustNil(t, "Inspect", err)
	if !bytes.Equal(e.Result, want) {
		t.Fatalf("Inspect: Result %q, want %q", e.Result, want)
	}
}
