package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/deduptest"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// newStore returns a migrated store in a fresh schema and its pool.
func newStore(t testing.TB, cfg pgdedup.Config) (*pgdedup.Store, *pgxpool.Pool) {
	t.Helper()
	return newStoreOn(t, cfg, nil)
}

// newStoreOn is newStore over a pool that configure, when not nil, set up.
func newStoreOn(t testing.TB, cfg pgdedup.Config, configure func(*pgxpool.Config)) (*pgdedup.Store, *pgxpool.Pool) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	cfg.Schema = testenv.Schema(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	if configure != nil {
		configure(pc)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	store, err := pgdedup.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return store, pool
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func rec(key, body string) dedup.Record {
	return dedup.Record{Key: key, PayloadHash: dedup.HashPayload([]byte(body))}
}

// claimCommit claims recs in a new transaction and commits it.
func claimCommit(t *testing.T, s *pgdedup.Store, scope string, recs ...dedup.Record) []dedup.Claim {
	t.Helper()
	ctx := testCtx(t)
	tx, err := s.Driver().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Driver().Rollback(ctx, tx)
	cs, err := s.Driver().Claim(ctx, tx, scope, recs)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Driver().Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return cs
}

func states(cs []dedup.Claim) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = c.Key + "=" + c.State.String()
	}
	return strings.Join(parts, " ")
}

func TestNewRejectsNonIdentifiers(t *testing.T) {
	bad := []pgdedup.Config{
		{Table: `processed_messages; DROP TABLE accounts; --`},
		{Table: `"quoted"`},
		{Schema: `public.other`},
		{Schema: `1abc`},
		{Table: strings.Repeat("t", 51)},
		{Retention: time.Millisecond},
		{CleanupBatchSize: -1},
	}
	for _, cfg := range bad {
		_, err := pgdedup.New(&pgxpool.Pool{}, cfg)
		if !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want idemq.ErrInvalidConfig", cfg, err)
		}
	}
	if _, err := pgdedup.New(nil, pgdedup.Config{}); !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Errorf("New(nil) = %v, want idemq.ErrInvalidConfig", err)
	}
	if _, err := pgdedup.New(&pgxpool.Pool{}, pgdedup.Config{Schema: "Tenant_1", Table: "Seen"}); err != nil {
		t.Errorf("New with mixed-case identifiers: %v", err)
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	store, pool := newStore(t, pgdedup.Config{Table: "Mixed_Case"})
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- store.Migrate(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	var n int
	schema := store.Config().Schema
	err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "Mixed_Case_migrations"}.Sanitize()).Scan(&n)
	m, merr := migrate.NewSQL(nil, migrate.Config{Schema: schema, Table: "Mixed_Case"})
	if merr != nil {
		t.Fatal(merr)
	}
	ms := m.AllVersions()
	if err != nil || n != len(ms) {
		t.Fatalf("migrations applied = %d, %v; want %d", n, err, len(ms))
	}
	var failures int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'Mixed_Case_failures'`, schema).Scan(&failures)
	if err != nil || failures != 1 {
		t.Fatalf("failure table in the store's schema = %d, %v; want 1", failures, err)
	}
	var idx int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'Mixed_Case_expires_at_idx'`, schema).Scan(&idx)
	if err != nil || idx != 1 {
		t.Fatalf("expiry index = %d, %v; want 1", idx, err)
	}
	if sql := m.SQL(); !strings.Contains(sql, `"Mixed_Case"`) || strings.Contains(sql, "EXISTS processed_messages") {
		t.Fatalf("migration SQL not rendered for the configured table:\n%s", sql)
	}
}

func TestClaimStates(t *testing.T) {
	store, _ := newStore(t, pgdedup.Config{})
	got := claimCommit(t, store, "s", rec("b", "1"), rec("a", "1"))
	if states(got) != "b=new a=new" {
		t.Fatalf("first claim: %s", states(got))
	}
	got = claimCommit(t, store, "s", rec("a", "1"), rec("c", "1"), rec("b", "other"))
	if states(got) != "a=done c=new b=mismatch" {
		t.Fatalf("second claim: %s", states(got))
	}
	if got[2].StoredHash != dedup.HashPayload([]byte("1")) {
		t.Fatalf("mismatch does not report the stored hash")
	}
	// Scopes are independent.
	if got := claimCommit(t, store, "other-scope", rec("a", "1")); got[0].State != dedup.StateNew {
		t.Fatalf("claim in another scope: %s", states(got))
	}
}

func TestClaimRollbackLeavesNoRecord(t *testing.T) {
	store, _ := newStore(t, pgdedup.Config{})
	ctx := testCtx(t)
	tx, err := store.Driver().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Driver().Rollback(ctx, tx) // released if the test fails first
	if _, err := store.Driver().Claim(ctx, tx, "s", []dedup.Record{rec("k", "x")}); err != nil {
		t.Fatal(err)
	}
	if err := store.Driver().Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Inspect(ctx, "s", "k"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("Inspect after rollback = %v, want ErrNotFound", err)
	}
}

// A commit the database refuses for the transaction's content matches
// dedup.ErrTxRefused, and a statement after a failed one is IsAborted.
func TestCommitRefusedAndAborted(t *testing.T) {
	store, _ := newStore(t, pgdedup.Config{})
	ctx := testCtx(t)
	for _, begin := range []string{"Begin", "BeginClaim"} {
		var tx pgx.Tx
		var err error
		if begin == "Begin" {
			tx, err = store.Driver().Begin(ctx)
		} else {
			tx, _, err = store.Driver().BeginClaim(ctx, "s", []dedup.Record{rec(begin, "x")})
		}
		if err != nil {
			t.Fatal(err)
		}
		defer store.Driver().Rollback(ctx, tx) // released if the test fails first
		_, swallowed := tx.Exec(ctx, "SELECT 1/0")
		_, err = tx.Exec(ctx, "SELECT 1")
		if swallowed == nil || store.Driver().IsAborted(swallowed) || !store.Driver().IsAborted(err) {
			t.Fatalf("%s: IsAborted(%v) = %v, IsAborted(%v) = %v; want false, true", begin, swallowed, store.Driver().IsAborted(swallowed), err, store.Driver().IsAborted(err))
		}
		if err := store.Driver().Commit(ctx, tx); !errors.Is(err, dedup.ErrTxRefused) {
			t.Fatalf("%s: commit of an aborted transaction = %v, want ErrTxRefused", begin, err)
		}
		if err := store.Driver().Rollback(ctx, tx); err != nil {
			t.Fatalf("%s: Rollback after Commit: %v", begin, err)
		}
	}
}

// A chained commit the server refuses (the transaction had failed, or a
// deferred constraint fails) reports committed false and ErrTxRefused,
// records neither the transaction's keys nor the next claim's, and leaves a
// connection that goes back to the pool clean.
func TestCommitChainRefused(t *testing.T) {
	store, pool := newStore(t, pgdedup.Config{})
	ctx := testCtx(t)
	unique := pgx.Identifier{store.Config().Schema, "chain_unique"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+unique+` (id int, UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct{ name, sql string }{
		{"aborted", `SELECT 1/0`},
		{"deferred constraint", `INSERT INTO ` + unique + ` VALUES (1), (1)`},
	} {
		mine, next := fmt.Sprintf("mine-%d", i), fmt.Sprintf("next-%d", i)
		func() {
			tx, cs, err := store.Driver().BeginClaim(ctx, "s", []dedup.Record{rec(mine, "x")})
			if err != nil || cs[0].State != dedup.StateNew {
				t.Fatalf("%s: BeginClaim: %v %v", tc.name, cs, err)
			}
			// Released before a failure is reported: a transaction left
			// open would hold its connection, and the pool's close, forever.
			rolledBack := false
			defer func() {
				if !rolledBack {
					_ = store.Driver().Rollback(ctx, tx)
				}
			}()
			_, _ = tx.Exec(ctx, tc.sql) // the error is swallowed, or comes at commit
			cs, committed, err := store.Driver().CommitChain(ctx, tx, "s", []dedup.Record{rec(next, "x")})
			if committed || !errors.Is(err, dedup.ErrTxRefused) || cs != nil {
				t.Fatalf("%s: CommitChain = %v, committed %v, %v; want nothing, false, ErrTxRefused", tc.name, cs, committed, err)
			}
			rolledBack = true
			if err := store.Driver().Rollback(ctx, tx); err != nil {
				t.Fatalf("%s: Rollback after a refused chain: %v", tc.name, err)
			}
		}()
		for _, k := range []string{mine, next} {
			if _, err := store.Inspect(ctx, "s", k); !errors.Is(err, dedup.ErrNotFound) {
				t.Fatalf("%s: record of %s: %v, want ErrNotFound", tc.name, k, err)
			}
		}
	}
	for range 4 { // every connection of the pool is clean
		tx, cs, err := store.Driver().BeginClaim(ctx, "s", []dedup.Record{rec("after", "x")})
		if err != nil || cs[0].State != dedup.StateNew {
			t.Fatalf("BeginClaim after the refused chains: %v %v", cs, err)
		}
		failed := store.Driver().Failed(tx)
		if err := store.Driver().Rollback(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if failed {
			t.Fatal("a pooled connection is in a failed transaction")
		}
	}
}

// TestConcurrentClaimWaitsForOutcome: a second transaction claiming a key
// held by an uncommitted first one waits, then sees the first's outcome.
func TestConcurrentClaimWaitsForOutcome(t *testing.T) {
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("commit=%v", commit), func(t *testing.T) {
			store, _ := newStore(t, pgdedup.Config{})
			ctx := testCtx(t)
			first, err := store.Driver().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer store.Driver().Rollback(ctx, first)
			if _, err := store.Driver().Claim(ctx, first, "s", []dedup.Record{rec("k", "x")}); err != nil {
				t.Fatal(err)
			}

			result := make(chan dedup.Claim, 1)
			go func() {
				tx, err := store.Driver().Begin(ctx)
				if err != nil {
					t.Error(err)
					result <- dedup.Claim{}
					return
				}
				defer store.Driver().Rollback(ctx, tx)
				cs, err := store.Driver().Claim(ctx, tx, "s", []dedup.Record{rec("k", "x")})
				if err != nil {
					t.Error(err)
					result <- dedup.Claim{}
					return
				}
				result <- cs[0]
			}()
			select {
			case c := <-result:
				t.Fatalf("second claim returned %v while the first transaction is open", c.State)
			case <-time.After(300 * time.Millisecond):
			}
			if commit {
				err = store.Driver().Commit(ctx, first)
			} else {
				err = store.Driver().Rollback(ctx, first)
			}
			if err != nil {
				t.Fatal(err)
			}
			want := dedup.StateNew
			if commit {
				want = dedup.StateDone
			}
			if c := <-result; c.State != want {
				t.Fatalf("second claim = %v, want %v", c.State, want)
			}
		})
	}
}

// TestCrossedBatchesDoNotDeadlock: batches with the same keys in opposite
// order lock them in one order.
func TestCrossedBatchesDoNotDeadlock(t *testing.T) {
	store, _ := newStore(t, pgdedup.Config{})
	ctx := testCtx(t)
	keys := make([]dedup.Record, 50)
	for i := range keys {
		keys[i] = rec(fmt.Sprintf("k%03d", i), "x")
	}
	reversed := make([]dedup.Record, len(keys))
	for i := range keys {
		reversed[len(keys)-1-i] = keys[i]
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	newCount := 0
	for w := range 8 {
		batch := keys
		if w%2 == 1 {
			batch = reversed
		}
		wg.Go(func() {
			tx, err := store.Driver().Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer store.Driver().Rollback(ctx, tx)
			cs, err := store.Driver().Claim(ctx, tx, "s", batch)
			if err != nil {
				t.Errorf("claim: %v", err)
				return
			}
			if err := store.Driver().Commit(ctx, tx); err != nil {
				t.Errorf("commit: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, c := range cs {
				if c.State == dedup.StateNew {
					newCount++
				}
			}
		})
	}
	wg.Wait()
	if newCount != len(keys) {
		t.Fatalf("%d keys claimed as new across 8 batches, want %d (each exactly once)", newCount, len(keys))
	}
}

func TestExpiredRecordIsClaimedAgainAndCleanedUp(t *testing.T) {
	store, pool := newStore(t, pgdedup.Config{CleanupBatchSize: 2})
	ctx := testCtx(t)
	claimCommit(t, store, "s", rec("old1", "x"), rec("old2", "x"), rec("old3", "x"), rec("fresh", "x"))
	table := pgx.Identifier{store.Config().Schema, "processed_messages"}.Sanitize()
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET expires_at = now() - interval '1 second' WHERE key LIKE 'old%'`); err != nil {
		t.Fatal(err)
	}
	if got := claimCommit(t, store, "s", rec("old1", "new payload")); got[0].State != dedup.StateNew {
		t.Fatalf("claim of an expired key = %v, want new", got[0].State)
	}
	n, err := store.Cleanup(ctx)
	if err != nil || n != 2 {
		t.Fatalf("Cleanup = %d, %v; want 2 (old2, old3)", n, err)
	}
	for key, want := range map[string]error{"old1": nil, "old2": dedup.ErrNotFound, "fresh": nil} {
		if _, err := store.Inspect(ctx, "s", key); !errors.Is(err, want) {
			t.Errorf("Inspect(%s) = %v, want %v", key, err, want)
		}
	}
}

// A backlog of expired records is deleted one batch per CleanupPause, so
// that cleaning it does not take a busy database from the claims; a
// negative pause deletes it back to back.
func TestCleanupPausesBetweenBatches(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pause time.Duration
		want  int64
		err   error
	}{
		{"pause", time.Hour, 2, context.DeadlineExceeded},
		{"no pause", -1, 5, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, pool := newStore(t, pgdedup.Config{CleanupBatchSize: 2, CleanupPause: tc.pause})
			ctx := testCtx(t)
			claimCommit(t, store, "s", rec("a", "x"), rec("b", "x"), rec("c", "x"), rec("d", "x"), rec("e", "x"))
			table := pgx.Identifier{store.Config().Schema, "processed_messages"}.Sanitize()
			if _, err := pool.Exec(ctx, `UPDATE `+table+` SET expires_at = now() - interval '1 second'`); err != nil {
				t.Fatal(err)
			}
			// Far shorter than the pause: Cleanup returns in the first pause.
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			n, err := store.Cleanup(cctx)
			if n != tc.want || !errors.Is(err, tc.err) {
				t.Fatalf("Cleanup of 5 expired records in batches of 2 with pause %s = %d, %v; want %d, %v", tc.pause, n, err, tc.want, tc.err)
			}
		})
	}
}

func TestCleanupPauseDefault(t *testing.T) {
	if got := (pgdedup.Config{}).WithDefaults().CleanupPause; got != 10*time.Millisecond {
		t.Fatalf("default CleanupPause = %s, want the documented 10ms", got)
	}
}

func TestCleanupSkipsLockedRows(t *testing.T) {
	store, pool := newStore(t, pgdedup.Config{})
	ctx := testCtx(t)
	claimCommit(t, store, "s", rec("a", "x"), rec("b", "x"))
	table := pgx.Identifier{store.Config().Schema, "processed_messages"}.Sanitize()
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+table+` WHERE key = 'a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := store.Cleanup(cctx)
	if err != nil || n != 1 {
		t.Fatalf("Cleanup with a locked row = %d, %v; want 1 without waiting", n, err)
	}
}

func TestMarkProcessedTx(t *testing.T) {
	store, _ := newStore(t, pgdedup.Config{})
	ctx := testCtx(t)
	mark := func(body string) (dedup.State, error) {
		tx, err := store.Driver().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		st, err := store.MarkProcessedTx(ctx, tx, "own", "order-1", []byte(body))
		if err == nil {
			err = tx.Commit(ctx)
		}
		return st, err
	}
	if st, err := mark("a"); st != dedup.StateNew || err != nil {
		t.Fatalf("first = %v, %v", st, err)
	}
	if st, err := mark("a"); st != dedup.StateDone || err != nil {
		t.Fatalf("second = %v, %v", st, err)
	}
	var mm *dedup.MismatchError
	if _, err := mark("b"); !errors.As(err, &mm) || !errors.Is(err, dedup.ErrPayloadMismatch) {
		t.Fatalf("different payload = %v, want *MismatchError", err)
	}
	e, err := store.Inspect(ctx, "own", "order-1")
	if err != nil || e.PayloadHash != dedup.HashPayload([]byte("a")) || !e.ExpiresAt.After(e.ProcessedAt) {
		t.Fatalf("Inspect = %+v, %v", e, err)
	}
	if ok, err := store.Purge(ctx, "own", "order-1"); !ok || err != nil {
		t.Fatalf("Purge = %v, %v", ok, err)
	}
}

// TestConformance runs the dedup store conformance suite against PostgreSQL.
func TestConformance(t *testing.T) {
	deduptest.RunTxStore(t, func(t *testing.T, retention time.Duration) dedupdriver.TxStore[pgx.Tx] {
		store, _ := newStore(t, pgdedup.Config{Retention: retention})
		return store
	})
}

// TestConformancePartitioned runs the suite on a table partitioned by day
// (migration 004), with the claim that serialises keys by advisory lock.
func TestConformancePartitioned(t *testing.T) {
	deduptest.RunTxStore(t, func(t *testing.T, retention time.Duration) dedupdriver.TxStore[pgx.Tx] {
		store, _ := newStore(t, pgdedup.Config{Retention: retention, Partitioned: true})
		return store
	})
}

func TestFailureCounterConformance(t *testing.T) {
	deduptest.RunFailureCounter(t, func(t *testing.T, retention time.Duration) dedupdriver.Common {
		store, _ := newStore(t, pgdedup.Config{Retention: retention})
		return store.Driver()
	})
}

func TestIsTransient(t *testing.T) {
	s, err := pgdedup.New(nopDB{}, pgdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "40001"}, true},
		{fmt.Errorf("update: %w", &pgconn.PgError{Code: "40P01"}), true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "25P03"}, true},
		{&pgconn.PgError{Code: "08003"}, true},
		{&pgconn.PgError{Code: "23505"}, false},
		// No partition for the clock's day (the janitor has not run for
		// PartitionsAhead days): the store's outage, not the message's.
		{&pgconn.PgError{Code: "23514", Message: `no partition of relation "processed_messages" found for row`}, true},
		{&pgconn.PgError{Code: "23514", ConstraintName: "amount_positive", Message: `new row violates check constraint "amount_positive"`}, false},
		{&pgconn.PgError{Code: "25P02"}, false},
		{&pgconn.PgError{Code: "55P03"}, false},
		{context.DeadlineExceeded, false},
		{fmt.Errorf("query: %w", context.Canceled), false},
		{&url.Error{Op: "Get", URL: "http://x", Err: io.ErrUnexpectedEOF}, false},
		{&net.DNSError{Err: "timeout", Name: "x", IsTimeout: true}, false},
		{io.ErrUnexpectedEOF, false},
		{errors.New("boom"), false},
		{nil, false},
	} {
		if got := s.Driver().IsTransient(tc.err); got != tc.want {
			t.Errorf("IsTransient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// nopDB is a DB that is never used.
type nopDB struct{ pgdedup.DB }
