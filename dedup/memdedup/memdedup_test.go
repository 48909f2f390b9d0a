package memdedup_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/memdedup"
)

// clock is a manual clock for retention and lease tests.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func newStore(t *testing.T, cfg memdedup.Config) *memdedup.Store {
	t.Helper()
	s, err := memdedup.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func rec(key, body string) dedup.Record {
	return dedup.Record{Key: key, PayloadHash: dedup.HashPayload([]byte(body))}
}

func begin(t *testing.T, s *memdedup.Store) *memdedup.Tx {
	t.Helper()
	tx, err := s.Begin(t.Context())
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	t.Cleanup(func() { _ = s.Rollback(context.Background(), tx) })
	return tx
}

func claim(t *testing.T, s *memdedup.Store, tx *memdedup.Tx, recs ...dedup.Record) []dedup.State {
	t.Helper()
	cs, err := s.Claim(t.Context(), tx, "scope", recs)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	states := make([]dedup.State, len(cs))
	for i, c := range cs {
		if c.Key != recs[i].Key {
			t.Fatalf("claim %d has key %q, want %q (results must follow the order of recs)", i, c.Key, recs[i].Key)
		}
		states[i] = c.State
	}
	return states
}

func commit(t *testing.T, s *memdedup.Store, tx *memdedup.Tx) {
	t.Helper()
	if err := s.Commit(t.Context(), tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func wantStates(t *testing.T, got []dedup.State, want ...dedup.State) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("states %v, want %v", got, want)
	}
}

func TestNewRejectsNegativeRetention(t *testing.T) {
	if _, err := memdedup.New(memdedup.Config{Retention: -time.Second}); err == nil {
		t.Fatal("New accepted a negative Retention")
	}
}

func TestClaimNewDoneMismatch(t *testing.T) {
	s := newStore(t, memdedup.Config{})
	tx := begin(t, s)
	wantStates(t, claim(t, s, tx, rec("b", "1"), rec("a", "1")), dedup.StateNew, dedup.StateNew)
	if err := tx.Add("effect", 1); err != nil {
		t.Fatal(err)
	}
	if got := s.Value("effect"); got != 0 {
		t.Fatalf("uncommitted effect visible: %d", got)
	}
	if got := tx.Value("effect"); got != 1 {
		t.Fatalf("tx does not see its own effect: %d", got)
	}
	commit(t, s, tx)
	if got := s.Value("effect"); got != 1 {
		t.Fatalf("committed effect = %d, want 1", got)
	}

	tx2 := begin(t, s)
	wantStates(t, claim(t, s, tx2, rec("a", "1"), rec("b", "other"), rec("c", "1")),
		dedup.StateDone, dedup.StateMismatch, dedup.StateNew)
	cs, err := s.Claim(t.Context(), tx2, "other-scope", []dedup.Record{rec("a", "1")})
	if err != nil || cs[0].State != dedup.StateNew {
		t.Fatalf("scopes are not separate: %v %v", cs, err)
	}
	if _, err := s.Claim(t.Context(), tx2, "scope", []dedup.Record{rec("c", "1")}); !errors.Is(err, memdedup.ErrDuplicateKey) {
		t.Fatalf("second claim of a key in one tx: %v, want ErrDuplicateKey", err)
	}
	if _, err := s.Claim(t.Context(), tx2, "scope", []dedup.Record{rec("d", "1"), rec("d", "1")}); !errors.Is(err, memdedup.ErrDuplicateKey) {
		t.Fatalf("duplicate key in recs: %v, want ErrDuplicateKey", err)
	}
	e, err := s.Record("scope", "a")
	if err != nil || e.PayloadHash != dedup.HashPayload([]byte("1")) || e.ProcessedAt.IsZero() {
		t.Fatalf("Record(a) = %+v, %v", e, err)
	}
	if _, err := s.Record("scope", "c"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("uncommitted claim visible through Record: %v", err)
	}
}

func TestClaimWaitsForOwner(t *testing.T) {
	for _, tc := range []struct {
		name   string
		finish func(s *memdedup.Store, tx *memdedup.Tx) error
		body   string
		want   dedup.State
	}{
		{"commit", func(s *memdedup.Store, tx *memdedup.Tx) error { return s.Commit(context.Background(), tx) }, "1", dedup.StateDone},
		{"commit-other-payload", func(s *memdedup.Store, tx *memdedup.Tx) error { return s.Commit(context.Background(), tx) }, "2", dedup.StateMismatch},
		{"rollback", func(s *memdedup.Store, tx *memdedup.Tx) error { return s.Rollback(context.Background(), tx) }, "1", dedup.StateNew},
		{"unclaim", func(s *memdedup.Store, tx *memdedup.Tx) error {
			if err := s.Unclaim(context.Background(), tx, "scope", "k"); err != nil {
				return err
			}
			return s.Commit(context.Background(), tx)
		}, "1", dedup.StateNew},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, memdedup.Config{})
			first := begin(t, s)
			claim(t, s, first, rec("k", "1"))

			second := begin(t, s)
			got := make(chan []dedup.Claim, 1)
			go func() {
				cs, err := s.Claim(context.Background(), second, "scope", []dedup.Record{rec("k", tc.body)})
				if err != nil {
					t.Errorf("waiting Claim: %v", err)
				}
				got <- cs
			}()
			select {
			case cs := <-got:
				t.Fatalf("Claim returned %v while another transaction held the key", cs)
			case <-time.After(50 * time.Millisecond):
			}
			if err := tc.finish(s, first); err != nil {
				t.Fatal(err)
			}
			select {
			case cs := <-got:
				if len(cs) != 1 || cs[0].State != tc.want {
					t.Fatalf("waiting Claim got %v, want %v", cs, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("waiting Claim did not return within 5s after the owner finished")
			}
		})
	}
}

func TestClaimWaitHonoursContext(t *testing.T) {
	s := newStore(t, memdedup.Config{})
	first := begin(t, s)
	claim(t, s, first, rec("k", "1"))
	second := begin(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := s.Claim(ctx, second, "scope", []dedup.Record{rec("k", "1")})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Claim on a held key past its deadline: %v, want DeadlineExceeded", err)
	}
}

func TestSavepoints(t *testing.T) {
	s := newStore(t, memdedup.Config{})
	tx := begin(t, s)
	if err := s.RollbackToSavepoint(t.Context(), tx); !errors.Is(err, memdedup.ErrNoSavepoint) {
		t.Fatalf("RollbackToSavepoint without savepoint: %v", err)
	}
	claim(t, s, tx, rec("a", "1"), rec("b", "1"), rec("c", "1"))

	// a succeeds.
	if err := s.Savepoint(t.Context(), tx, false); err != nil {
		t.Fatal(err)
	}
	_ = tx.Add("a", 1)
	// b fails: its effect is undone and its claim removed.
	if err := s.Savepoint(t.Context(), tx, true); err != nil {
		t.Fatal(err)
	}
	_ = tx.Add("b", 1)
	if err := s.RollbackToSavepoint(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	if err := s.Unclaim(t.Context(), tx, "scope", "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Unclaim(t.Context(), tx, "scope", "b"); !errors.Is(err, memdedup.ErrNotClaimed) {
		t.Fatalf("second Unclaim: %v, want ErrNotClaimed", err)
	}
	// c succeeds.
	if err := s.Savepoint(t.Context(), tx, true); err != nil {
		t.Fatal(err)
	}
	_ = tx.Add("c", 1)
	commit(t, s, tx)

	if v := s.Values(); v["a"] != 1 || v["b"] != 0 || v["c"] != 1 {
		t.Fatalf("values after commit: %v, want a=1 c=1 and no b", v)
	}
	tx2 := begin(t, s)
	wantStates(t, claim(t, s, tx2, rec("a", "1"), rec("b", "1"), rec("c", "1")),
		dedup.StateDone, dedup.StateNew, dedup.StateDone)
}

func TestRollbackToSavepointUndoesLaterClaims(t *testing.T) {
	s := newStore(t, memdedup.Config{})
	tx := begin(t, s)
	if err := s.Savepoint(t.Context(), tx, false); err != nil {
		t.Fatal(err)
	}
	claim(t, s, tx, rec("a", "1"))
	if err := s.RollbackToSavepoint(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	other := begin(t, s)
	wantStates(t, claim(t, s, other, rec("a", "1")), dedup.StateNew)
}

func TestTxDone(t *testing.T) {
	s := newStore(t, memdedup.Config{})
	tx := begin(t, s)
	commit(t, s, tx)
	if err := s.Rollback(t.Context(), tx); err != nil {
		t.Fatalf("Rollback after Commit: %v, want nil", err)
	}
	if err := s.Commit(t.Context(), tx); !errors.Is(err, memdedup.ErrTxDone) {
		t.Fatalf("second Commit: %v", err)
	}
	if _, err := s.Claim(t.Context(), tx, "scope", []dedup.Record{rec("a", "1")}); !errors.Is(err, memdedup.ErrTxDone) {
		t.Fatalf("Claim after Commit: %v", err)
	}
	if err := tx.Add("x", 1); !errors.Is(err, memdedup.ErrTxDone) {
		t.Fatalf("Add after Commit: %v", err)
	}
	other := newStore(t, memdedup.Config{})
	tx2 := begin(t, other)
	if err := s.Commit(t.Context(), tx2); !errors.Is(err, memdedup.ErrForeignTx) {
		t.Fatalf("Commit of another store's tx: %v", err)
	}
	if s.OpenTxs() != 0 {
		t.Fatalf("OpenTxs = %d, want 0", s.OpenTxs())
	}
}

func TestRetention(t *testing.T) {
	c := newClock()
	s := newStore(t, memdedup.Config{Now: c.Now, Retention: time.Hour})
	tx := begin(t, s)
	claim(t, s, tx, rec("a", "1"))
	commit(t, s, tx)

	c.Advance(59 * time.Minute)
	tx = begin(t, s)
	wantStates(t, claim(t, s, tx, rec("a", "1")), dedup.StateDone)
	commit(t, s, tx)

	c.Advance(time.Minute)
	if _, err := s.Record("scope", "a"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("expired record still visible: %v", err)
	}
	if n := s.Sweep(); n != 1 {
		t.Fatalf("Sweep removed %d records, want 1", n)
	}
	tx = begin(t, s)
	wantStates(t, claim(t, s, tx, rec("a", "1")), dedup.StateNew)
}

func TestFaults(t *testing.T) {
	boom := errors.New("boom")

	t.Run("begin", func(t *testing.T) {
		s := newStore(t, memdedup.Config{})
		s.Inject(memdedup.Fault{Kind: memdedup.BeginError, Err: boom, Times: 2})
		for range 2 {
			if _, err := s.Begin(t.Context()); !errors.Is(err, boom) {
				t.Fatalf("Begin: %v, want boom", err)
			}
		}
		begin(t, s)
	})

	t.Run("claim", func(t *testing.T) {
		s := newStore(t, memdedup.Config{})
		s.Inject(memdedup.Fault{Kind: memdedup.ClaimError})
		tx := begin(t, s)
		if _, err := s.Claim(t.Context(), tx, "scope", []dedup.Record{rec("a", "1")}); !errors.Is(err, memdedup.ErrInjected) {
			t.Fatalf("Claim: %v, want ErrInjected", err)
		}
		wantStates(t, claim(t, s, tx, rec("a", "1")), dedup.StateNew)
	})

	t.Run("commit", func(t *testing.T) {
		s := newStore(t, memdedup.Config{})
		s.Inject(memdedup.Fault{Kind: memdedup.CommitError, Err: boom})
		tx := begin(t, s)
		claim(t, s, tx, rec("a", "1"))
		_ = tx.Add("a", 1)
		if err := s.Commit(t.Context(), tx); !errors.Is(err, boom) {
			t.Fatalf("Commit: %v, want boom", err)
		}
		if s.Value("a") != 0 {
			t.Fatal("failed commit applied its effect")
		}
		tx = begin(t, s)
		wantStates(t, claim(t, s, tx, rec("a", "1")), dedup.StateNew)
	})

	t.Run("commit-applied", func(t *testing.T) {
		s := newStore(t, memdedup.Config{})
		s.Inject(memdedup.Fault{Kind: memdedup.CommitError, Applied: true})
		tx := begin(t, s)
		claim(t, s, tx, rec("a", "1"))
		_ = tx.Add("a", 1)
		if err := s.Commit(t.Context(), tx); !errors.Is(err, memdedup.ErrInjected) {
			t.Fatalf("Commit: %v, want ErrInjected", err)
		}
		if s.Value("a") != 1 {
			t.Fatal("applied commit did not apply its effect")
		}
		tx = begin(t, s)
		wantStates(t, claim(t, s, tx, rec("a", "1")), dedup.StateDone)
	})

	t.Run("forever-and-clear", func(t *testing.T) {
		s := newStore(t, memdedup.Config{})
		s.Inject(memdedup.Fault{Kind: memdedup.BeginError, Times: -1})
		for range 5 {
			if _, err := s.Begin(t.Context()); err == nil {
				t.Fatal("Begin succeeded under a permanent fault")
			}
		}
		s.ClearFaults()
		begin(t, s)
	})
}

func TestEvents(t *testing.T) {
	var hooked []memdedup.Event
	var mu sync.Mutex
	s := newStore(t, memdedup.Config{OnEvent: func(e memdedup.Event) {
		mu.Lock()
		defer mu.Unlock()
		hooked = append(hooked, e)
	}})
	s.Inject(memdedup.Fault{Kind: memdedup.CommitError, Times: 1})

	tx := begin(t, s)
	claim(t, s, tx, rec("a", "1"))
	_ = s.Commit(t.Context(), tx) // fails
	tx = begin(t, s)
	claim(t, s, tx, rec("b", "1"), rec("a", "1"))
	commit(t, s, tx)
	tx = begin(t, s)
	_ = s.Rollback(t.Context(), tx)

	events := s.Events()
	kinds := make([]memdedup.EventKind, len(events))
	for i, e := range events {
		kinds[i] = e.Kind
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has Seq %d", i, e.Seq)
		}
	}
	want := []memdedup.EventKind{memdedup.EventBegin, memdedup.EventCommitFailed, memdedup.EventBegin, memdedup.EventCommit, memdedup.EventBegin, memdedup.EventRollback}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
	if keys := events[3].Keys; len(keys) != 2 || keys[0].Key != "a" || keys[1].Key != "b" {
		t.Fatalf("commit event keys %v, want a and b", keys)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(hooked) != len(events) {
		t.Fatalf("OnEvent saw %d events, log has %d", len(hooked), len(events))
	}
}

func TestConcurrentClaimsApplyOnce(t *testing.T) {
	s := newStore(t, memdedup.Config{})
	const workers, keys = 8, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range keys {
				// Each worker claims two keys, in opposite orders on
				// alternate workers, to exercise lock ordering.
				a, b := fmt.Sprintf("k%02d", i), fmt.Sprintf("k%02d", (i+1)%keys)
				if w%2 == 1 {
					a, b = b, a
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				tx, err := s.Begin(ctx)
				if err != nil {
					t.Error(err)
					cancel()
					return
				}
				cs, err := s.Claim(ctx, tx, "scope", []dedup.Record{rec(a, "1"), rec(b, "1")})
				if err != nil {
					t.Errorf("Claim: %v (deadlock?)", err)
					_ = s.Rollback(ctx, tx)
					cancel()
					return
				}
				for _, c := range cs {
					if c.State == dedup.StateNew {
						_ = tx.Add(c.Key, 1)
					}
				}
				if err := s.Commit(ctx, tx); err != nil {
					t.Error(err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	for k, v := range s.Values() {
		if v != 1 {
			t.Errorf("effect %s applied %d times", k, v)
		}
	}
	if n := len(s.Values()); n != keys {
		t.Errorf("%d effects, want %d", n, keys)
	}
}

func TestLeases(t *testing.T) {
	c := newClock()
	s := newStore(t, memdedup.Config{Now: c.Now, Retention: time.Hour})
	ls := s.Leases()
	ctx := t.Context()
	r := rec("k", "1")

	cl, err := ls.Claim(ctx, "scope", r, "t1", time.Minute)
	if err != nil || cl.State != dedup.StateNew {
		t.Fatalf("first Claim: %v %v", cl, err)
	}
	if cl, _ := ls.Claim(ctx, "scope", r, "t2", time.Minute); cl.State != dedup.StateInProgress {
		t.Fatalf("Claim of a held lease: %v, want in-progress", cl.State)
	}
	if err := ls.Refresh(ctx, "scope", "k", "t2", time.Minute); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Refresh with a foreign token: %v", err)
	}
	if err := ls.Abandon(ctx, "scope", "k", "t2"); err != nil {
		t.Fatalf("Abandon with a foreign token: %v, want nil", err)
	}
	if e, err := ls.Inspect(ctx, "scope", "k"); err != nil || !e.InProgress {
		t.Fatalf("Inspect of a held lease: %+v %v", e, err)
	}

	// The lease expires; t2 takes over, t1 has lost it.
	c.Advance(time.Minute)
	if cl, _ := ls.Claim(ctx, "scope", r, "t2", time.Minute); cl.State != dedup.StateNew {
		t.Fatalf("Claim of an expired lease: %v, want new", cl.State)
	}
	if err := ls.Complete(ctx, "scope", "k", "t1", 0); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Complete with a lost lease: %v", err)
	}
	c.Advance(30 * time.Second)
	if err := ls.Refresh(ctx, "scope", "k", "t2", time.Minute); err != nil {
		t.Fatal(err)
	}
	c.Advance(45 * time.Second) // alive thanks to the refresh
	if err := ls.Complete(ctx, "scope", "k", "t2", 0); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if cl, _ := ls.Claim(ctx, "scope", r, "t3", time.Minute); cl.State != dedup.StateDone {
		t.Fatalf("Claim of a done key: %v", cl.State)
	}
	if cl, _ := ls.Claim(ctx, "scope", rec("k", "2"), "t3", time.Minute); cl.State != dedup.StateMismatch {
		t.Fatalf("Claim of a done key with another payload: %v", cl.State)
	}
	if e, err := ls.Inspect(ctx, "scope", "k"); err != nil || e.InProgress || e.ProcessedAt.IsZero() {
		t.Fatalf("Inspect of a done key: %+v %v", e, err)
	}

	// Abandon after a failure frees the key at once.
	if cl, _ := ls.Claim(ctx, "scope", rec("j", "1"), "t4", time.Minute); cl.State != dedup.StateNew {
		t.Fatal("Claim of j")
	}
	if err := ls.Abandon(ctx, "scope", "j", "t4"); err != nil {
		t.Fatal(err)
	}
	if cl, _ := ls.Claim(ctx, "scope", rec("j", "1"), "t5", time.Minute); cl.State != dedup.StateNew {
		t.Fatalf("Claim after Abandon: %v", cl.State)
	}

	// Retention ends.
	c.Advance(time.Hour)
	if _, err := ls.Inspect(ctx, "scope", "k"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("Inspect after retention: %v", err)
	}
	if cl, _ := ls.Claim(ctx, "scope", r, "t6", time.Minute); cl.State != dedup.StateNew {
		t.Fatalf("Claim after retention: %v", cl.State)
	}
	if _, err := ls.Claim(ctx, "scope", r, "t7", 0); err == nil {
		t.Fatal("Claim with a zero lease succeeded")
	}
}
