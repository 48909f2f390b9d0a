package pgdedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/pgtrace"
)

// newCountedStore returns a migrated store over a pool of one connection
// whose round trips c counts.
func newCountedStore(t *testing.T) (*pgdedup.Store, *pgxpool.Pool, *pgtrace.Counter) {
	t.Helper()
	c := &pgtrace.Counter{}
	store, pool := newStoreOn(t, pgdedup.Config{}, func(pc *pgxpool.Config) {
		pc.MaxConns = 1 // a connection the store failed to give back blocks the next Begin
		pc.ConnConfig.Tracer = c
	})
	return store, pool, c
}

// backendPID returns the server process of the pool's connection, to tell
// whether the store gave its connection back intact or had it closed.
func backendPID(ctx context.Context, t *testing.T, pool *pgxpool.Pool) int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a leaked connection fails here, not at the test timeout
	defer cancel()
	var pid int32
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatalf("the pool's connection is not available: %v", err)
	}
	return pid
}

// TestStoreResults groups the tests of the results kept with records
// (dedupdriver.Caps.Results) and what they cost.
func TestStoreResults(t *testing.T) {
	t.Run("one round trip of their own with a plain Commit", func(t *testing.T) {
		s, pool, c := newCountedStore(t)
		ctx := testCtx(t)
		pid := backendPID(ctx, t, pool)
		c.Trips.Store(0)
		tx, cs, err := s.Driver().BeginClaim(ctx, "sc", []dedup.Record{rec("a", "x"), rec("b", "x")})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Driver().Rollback(ctx, tx)
		if states(cs) != "a=new b=new" {
			t.Fatalf("claims %s", states(cs))
		}
		if err := s.Driver().StoreResults(ctx, tx, "sc", []dedup.Result{{Key: "a", Value: []byte("ra")}, {Key: "b", Value: []byte("rb")}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Driver().Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if got := c.Trips.Load(); got != 3 {
			t.Errorf("BeginClaim, StoreResults and Commit took %d round trips, want 3 (begin+claim, results, commit)", got)
		}
		if err := s.Driver().Rollback(ctx, tx); err != nil {
			t.Errorf("Rollback after Commit: %v", err)
		}
		if got := backendPID(ctx, t, pool); got != pid {
			t.Errorf("the connection was replaced (backend %d, was %d): the commit closed it", got, pid)
		}
		for _, k := range []string{"a", "b"} {
			e, err := s.Inspect(ctx, "sc", k)
			if err != nil || string(e.Result) != "r"+k {
				t.Errorf("Inspect(%s) = %q, %v; want result %q", k, e.Result, err, "r"+k)
			}
		}
	})

	t.Run("no round trip of their own with CommitChain", func(t *testing.T) {
		// The first transaction's results go with COMMIT AND CHAIN; the
		// second's, ended by a plain Commit, take one of their own.
		s, pool, c := newCountedStore(t)
		ctx := testCtx(t)
		pid := backendPID(ctx, t, pool)
		c.Trips.Store(0)
		tx, _, err := s.Driver().BeginClaim(ctx, "sc", []dedup.Record{rec("a", "x")})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Driver().Rollback(ctx, tx)
		if err := s.Driver().StoreResults(ctx, tx, "sc", []dedup.Result{{Key: "a", Value: []byte("ra")}}); err != nil {
			t.Fatal(err)
		}
		cs, committed, err := s.Driver().CommitChain(ctx, tx, "sc", []dedup.Record{rec("b", "x")})
		if err != nil || !committed || states(cs) != "b=new" {
			t.Fatalf("CommitChain = %s, %v, %v; want b=new, committed", states(cs), committed, err)
		}
		if err := s.Driver().StoreResults(ctx, tx, "sc", []dedup.Result{{Key: "b", Value: []byte("rb")}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Driver().Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if got := c.Trips.Load(); got != 4 {
			t.Errorf("two chained transactions with results took %d round trips, want 4 (begin+claim, results+commit and chain+claim, results, commit)", got)
		}
		if got := backendPID(ctx, t, pool); got != pid {
			t.Errorf("the connection was replaced (backend %d, was %d)", got, pid)
		}
		for _, k := range []string{"a", "b"} {
			e, err := s.Inspect(ctx, "sc", k)
			if err != nil || string(e.Result) != "r"+k {
				t.Errorf("Inspect(%s) = %q, %v; want result %q", k, e.Result, err, "r"+k)
			}
		}
	})

	t.Run("rolled back with their transaction", func(t *testing.T) {
		s, _, _ := newCountedStore(t)
		ctx := testCtx(t)
		tx, _, err := s.Driver().BeginClaim(ctx, "sc", []dedup.Record{rec("a", "x")})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Driver().StoreResults(ctx, tx, "sc", []dedup.Result{{Key: "a", Value: []byte("ra")}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Driver().Rollback(ctx, tx); err != nil {
			t.Fatal(err)
		}
		// The same key in a new transaction: the rolled-back result must
		// not follow it.
		tx, cs, err := s.Driver().BeginClaim(ctx, "sc", []dedup.Record{rec("a", "x")})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Driver().Rollback(ctx, tx)
		if states(cs) != "a=new" {
			t.Fatalf("claims after the rollback %s, want a=new", states(cs))
		}
		if err := s.Driver().Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if e, err := s.Inspect(ctx, "sc", "a"); err != nil || e.Result != nil {
			t.Errorf("Inspect = %q, %v; want the record without a result", e.Result, err)
		}
	})

	t.Run("a failed transaction is refused with its results", func(t *testing.T) {
		s, pool, _ := newCountedStore(t)
		ctx := testCtx(t)
		pid := backendPID(ctx, t, pool)
		tx, _, err := s.Driver().BeginClaim(ctx, "sc", []dedup.Record{rec("a", "x")})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Driver().Rollback(ctx, tx)
		// A handler's statement fails and the handler swallows it.
		if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
			t.Fatal("division by zero succeeded")
		}
		if err := s.Driver().StoreResults(ctx, tx, "sc", []dedup.Result{{Key: "a", Value: []byte("ra")}}); err != nil && !s.Driver().IsAborted(err) {
			t.Fatalf("StoreResults: %v", err)
		}
		err = s.Driver().Commit(ctx, tx)
		if !errors.Is(err, dedup.ErrTxRefused) {
			t.Fatalf("Commit = %v, want an error matching dedup.ErrTxRefused", err)
		}
		if err := s.Driver().Rollback(ctx, tx); err != nil {
			t.Errorf("Rollback after the refused Commit: %v", err)
		}
		if got := backendPID(ctx, t, pool); got != pid {
			t.Errorf("the connection was replaced (backend %d, was %d)", got, pid)
		}
		if _, err := s.Inspect(ctx, "sc", "a"); !errors.Is(err, dedup.ErrNotFound) {
			t.Errorf("Inspect = %v, want dedup.ErrNotFound", err)
		}
	})
}
