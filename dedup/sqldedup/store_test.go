package sqldedup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/deduptest"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/testenv"
)

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// sqliteFile opens a fresh SQLite database with OpenSQLite: BEGIN IMMEDIATE,
// busy timeout, WAL, one connection.
func sqliteFile(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sqldedup.OpenSQLite(testCtx(t), filepath.Join(t.TempDir(), "dedup.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// sqlitePool opens a SQLite database with n connections, each a separate
// SQLite connection that contends for the file lock as another process would.
// With immediate false, transactions begin DEFERRED.
func sqlitePool(t *testing.T, n int, immediate bool) *sql.DB {
	t.Helper()
	dsn := sqldedup.SQLiteDSN(filepath.Join(t.TempDir(), "dedup.db"))
	if !immediate {
		dsn = strings.Replace(dsn, "_txlock=immediate", "_txlock=deferred", 1)
	}
	db, err := sql.Open(sqldedup.SQLiteDriver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(n)
	t.Cleanup(func() { db.Close() })
	return db
}

// postgres opens a database/sql pool on a fresh schema of the test database.
func postgres(t testing.TB) (*sql.DB, string) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(12)
	t.Cleanup(func() { db.Close() }) // before the schema is dropped
	return db, schema
}

func migrated(t testing.TB, db *sql.DB, cfg sqldedup.Config) *sqldedup.Store {
	t.Helper()
	s, err := sqldedup.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return s
}

// backends returns a store constructor per dialect, so that every test runs
// against SQLite and PostgreSQL.
func backends() map[string]func(t *testing.T, cfg sqldedup.Config) (*sqldedup.Store, *sql.DB) {
	return map[string]func(t *testing.T, cfg sqldedup.Config) (*sqldedup.Store, *sql.DB){
		"sqlite": func(t *testing.T, cfg sqldedup.Config) (*sqldedup.Store, *sql.DB) {
			db := sqliteFile(t)
			cfg.Dialect = sqldedup.SQLite
			return migrated(t, db, cfg), db
		},
		"postgres": func(t *testing.T, cfg sqldedup.Config) (*sqldedup.Store, *sql.DB) {
			db, schema := postgres(t)
			cfg.Dialect, cfg.Schema = sqldedup.Postgres, schema
			return migrated(t, db, cfg), db
		},
	}
}

func TestConformance(t *testing.T) {
	sqliteWith := func(open func(t *testing.T) *sql.DB) func(t *testing.T, retention time.Duration) dedupdriver.TxStore[*sql.Tx] {
		return func(t *testing.T, retention time.Duration) dedupdriver.TxStore[*sql.Tx] {
			return migrated(t, open(t), sqldedup.Config{Dialect: sqldedup.SQLite, Retention: retention})
		}
	}
	t.Run("sqlite", func(t *testing.T) {
		deduptest.RunTxStore(t, sqliteWith(func(t *testing.T) *sql.DB { return sqliteFile(t) }))
	})
	// Several connections contend for the file lock like processes do.
	t.Run("sqlite-connections", func(t *testing.T) {
		deduptest.RunTxStore(t, sqliteWith(func(t *testing.T) *sql.DB { return sqlitePool(t, 10, true) }))
	})
	// Deferred transactions: Claim's insert is the first statement and
	// takes the write lock, waiting through the busy timeout.
	t.Run("sqlite-deferred", func(t *testing.T) {
		deduptest.RunTxStore(t, sqliteWith(func(t *testing.T) *sql.DB { return sqlitePool(t, 10, false) }))
	})
	t.Run("postgres", func(t *testing.T) {
		deduptest.RunTxStore(t, func(t *testing.T, retention time.Duration) dedupdriver.TxStore[*sql.Tx] {
			db, schema := postgres(t)
			return migrated(t, db, sqldedup.Config{Dialect: sqldedup.Postgres, Schema: schema, Retention: retention})
		})
	})
}

func TestConfigValidation(t *testing.T) {
	db := &sql.DB{} // never used: New does not touch the database
	for _, tc := range []struct {
		name string
		cfg  sqldedup.Config
	}{
		{"no dialect", sqldedup.Config{}},
		{"unknown dialect", sqldedup.Config{Dialect: "mysql"}},
		{"schema on sqlite", sqldedup.Config{Dialect: sqldedup.SQLite, Schema: "main"}},
		{"injected schema", sqldedup.Config{Dialect: sqldedup.Postgres, Schema: `x"; DROP TABLE t; --`}},
		{"injected table", sqldedup.Config{Dialect: sqldedup.SQLite, Table: "t; DROP TABLE t"}},
		{"long table", sqldedup.Config{Dialect: sqldedup.SQLite, Table: strings.Repeat("t", 51)}},
		{"tiny retention", sqldedup.Config{Dialect: sqldedup.SQLite, Retention: time.Microsecond}},
		{"negative interval", sqldedup.Config{Dialect: sqldedup.SQLite, CleanupInterval: -time.Second}},
		{"negative batch", sqldedup.Config{Dialect: sqldedup.SQLite, CleanupBatchSize: -1}},
	} {
		if _, err := sqldedup.New(db, tc.cfg); !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want idemq.ErrInvalidConfig", tc.name, err)
		}
	}
	if _, err := sqldedup.New(nil, sqldedup.Config{Dialect: sqldedup.SQLite}); !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Errorf("nil DB: %v", err)
	}
	s, err := sqldedup.New(db, sqldedup.Config{Dialect: sqldedup.Postgres})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Config(); c.Schema != "public" || c.Table != "processed_messages" || c.Retention != dedup.DefaultRetention {
		t.Errorf("defaults: %+v", c)
	}
	if _, err := sqldedup.OpenSQLite(testCtx(t), "x.db?mode=ro"); !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Errorf("OpenSQLite with a query in the path: %v", err)
	}
}

func TestMigrateTwiceAndConcurrently(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			store, db := open(t, sqldedup.Config{})
			ctx := testCtx(t)
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				wg.Go(func() { errs[i] = store.Migrate(ctx) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("concurrent Migrate: %v", err)
			}
			var versions int
			table := `"processed_messages_migrations"`
			if c := store.Config(); c.Dialect == sqldedup.Postgres {
				table = `"` + c.Schema + `".` + table
			}
			m, err := migrate.NewSQL(nil, migrate.Config{Dialect: store.Config().Dialect})
			if err != nil {
				t.Fatal(err)
			}
			ms := m.AllVersions()
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&versions); err != nil || versions != len(ms) {
				t.Fatalf("applied migrations = %d, %v; want %d", versions, err, len(ms))
			}
		})
	}
}

func rec(key, body string) dedup.Record {
	return dedup.Record{Key: key, PayloadHash: dedup.HashPayload([]byte(body))}
}

func TestMarkProcessedTxInspectPurge(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			store, db := open(t, sqldedup.Config{Retention: time.Hour})
			ctx := testCtx(t)
			mark := func(body string) (dedup.State, error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				st, err := store.MarkProcessedTx(ctx, tx, "own", "order-1", []byte(body))
				if err == nil {
					err = tx.Commit()
				}
				return st, err
			}
			before := time.Now().Add(-time.Second)
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
			if err != nil || e.PayloadHash != dedup.HashPayload([]byte("a")) || e.ProcessedAt.Before(before) ||
				e.ExpiresAt.Sub(e.ProcessedAt) != time.Hour {
				t.Fatalf("Inspect = %+v, %v; want hash of a, processed now, expiring 1h later", e, err)
			}
			if ok, err := store.Purge(ctx, "own", "order-1"); !ok || err != nil {
				t.Fatalf("Purge = %v, %v", ok, err)
			}
			if _, err := store.Inspect(ctx, "own", "order-1"); !errors.Is(err, dedup.ErrNotFound) {
				t.Fatalf("Inspect after Purge = %v, want ErrNotFound", err)
			}
			if ok, err := store.Purge(ctx, "own", "order-1"); ok || err != nil {
				t.Fatalf("second Purge = %v, %v; want false, nil", ok, err)
			}
		})
	}
}

func claimCommit(t *testing.T, store *sqldedup.Store, scope string, recs ...dedup.Record) []dedup.Claim {
	t.Helper()
	ctx := testCtx(t)
	tx, err := store.Driver().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Driver().Rollback(ctx, tx)
	cs, err := store.Driver().Claim(ctx, tx, scope, recs)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Driver().Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestExpiredRecordsAreClaimedAgainAndCleanedUp(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			store, db := open(t, sqldedup.Config{CleanupBatchSize: 2})
			ctx := testCtx(t)
			claimCommit(t, store, "s", rec("old1", "x"), rec("old2", "x"), rec("old3", "x"), rec("fresh", "x"))
			expire := `UPDATE "processed_messages" SET expires_at = 0 WHERE key LIKE 'old%'`
			if c := store.Config(); c.Dialect == sqldedup.Postgres {
				expire = `UPDATE "` + c.Schema + `"."processed_messages" SET expires_at = now() - interval '1 second' WHERE key LIKE 'old%'`
			}
			if _, err := db.ExecContext(ctx, expire); err != nil {
				t.Fatal(err)
			}
			if got := claimCommit(t, store, "s", rec("old1", "new payload"), rec("fresh", "x")); got[0].State != dedup.StateNew || got[1].State != dedup.StateDone {
				t.Fatalf("claim of an expired and a live key = %v, %v; want new, done", got[0].State, got[1].State)
			}
			n, err := store.Cleanup(ctx)
			if err != nil || n != 2 {
				t.Fatalf("Cleanup = %d, %v; want 2 (old2, old3) in batches of 2", n, err)
			}
			for key, want := range map[string]error{"old1": nil, "old2": dedup.ErrNotFound, "old3": dedup.ErrNotFound, "fresh": nil} {
				if _, err := store.Inspect(ctx, "s", key); !errors.Is(err, want) {
					t.Errorf("Inspect(%s) = %v, want %v", key, err, want)
				}
			}
			if n, err := store.Cleanup(ctx); n != 0 || err != nil {
				t.Fatalf("second Cleanup = %d, %v; want 0", n, err)
			}
		})
	}
}

func TestJanitorStopsWithContext(t *testing.T) {
	store, _ := backends()["sqlite"](t, sqldedup.Config{CleanupInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { done <- store.RunJanitor(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("RunJanitor = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("RunJanitor did not return after its context was cancelled")
	}
}

// TestClaimManyKeysAcrossStatements claims more keys than fit in one
// statement, unsorted, and checks that the answers follow the input order.
func TestClaimManyKeysAcrossStatements(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			store, _ := open(t, sqldedup.Config{})
			const n = 1234
			recs := make([]dedup.Record, n)
			for i := range recs {
				recs[i] = rec(fmt.Sprintf("k%05d", (i*7919)%n), "x")
			}
			claimCommit(t, store, "s", recs[:n/3]...)
			cs := claimCommit(t, store, "s", recs...)
			for i, c := range cs {
				want := dedup.StateNew
				if i < n/3 {
					want = dedup.StateDone
				}
				if c.Key != recs[i].Key || c.State != want {
					t.Fatalf("claim %d = %s %v, want %s %v", i, c.Key, c.State, recs[i].Key, want)
				}
			}
		})
	}
}

type sqliteErr int

func (e sqliteErr) Error() string { return "sqlite error" }
func (e sqliteErr) Code() int     { return int(e) }

type pgErr string

func (e pgErr) Error() string    { return "pg error " + string(e) }
func (e pgErr) SQLState() string { return string(e) }

func TestIsTransient(t *testing.T) {
	lite, err := sqldedup.New(&sql.DB{}, sqldedup.Config{Dialect: sqldedup.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := sqldedup.New(&sql.DB{}, sqldedup.Config{Dialect: sqldedup.Postgres})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		store *sqldedup.Store
		err   error
		want  bool
	}{
		{lite, fmt.Errorf("insert: %w", sqliteErr(5)), true}, // SQLITE_BUSY
		{lite, sqliteErr(5 | 2<<8), true},                    // SQLITE_BUSY_SNAPSHOT
		{lite, sqliteErr(6), true},                           // SQLITE_LOCKED
		{lite, sqliteErr(19), false},                         // SQLITE_CONSTRAINT
		{lite, errors.New("no such table: ledger"), false},   // a bug, not a passing state
		{pg, fmt.Errorf("update: %w", pgErr("40P01")), true}, // deadlock
		{pg, pgErr("40001"), true},                           // serialization failure
		{pg, pgErr("08006"), true},                           // connection failure
		{pg, pgErr("25P03"), true},                           // idle-in-transaction timeout killed the session
		{pg, pgErr("57P01"), true},                           // admin shutdown
		{pg, pgErr("23505"), false},                          // unique violation
		{pg, sqliteErr(5), false},                            // a code from another dialect
		{pg, fmt.Errorf("exec: %w", sql.ErrConnDone), true},  // lost connection
		{lite, nil, false},
		{pg, pgErr("55P03"), false},                                                   // lock timeout: the handler's own setting
		{pg, fmt.Errorf("handler: %w", context.DeadlineExceeded), false},              // a handler past its deadline
		{pg, &url.Error{Op: "Get", URL: "http://x", Err: io.ErrUnexpectedEOF}, false}, // a handler's HTTP call
		{pg, &net.DNSError{Err: "timeout", Name: "x", IsTimeout: true}, false},
		{lite, fmt.Errorf("decode: %w", io.ErrUnexpectedEOF), false},
	} {
		if got := tc.store.Driver().IsTransient(tc.err); got != tc.want {
			t.Errorf("%s IsTransient(%v) = %v, want %v", tc.store.Config().Dialect, tc.err, got, tc.want)
		}
	}
}

func TestFailureCounterConformance(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		deduptest.RunFailureCounter(t, func(t *testing.T, retention time.Duration) dedupdriver.Common {
			return migrated(t, sqlitePool(t, 10, true), sqldedup.Config{Dialect: sqldedup.SQLite, Retention: retention}).Driver()
		})
	})
	t.Run("postgres", func(t *testing.T) {
		deduptest.RunFailureCounter(t, func(t *testing.T, retention time.Duration) dedupdriver.Common {
			db, schema := postgres(t)
			return migrated(t, db, sqldedup.Config{Dialect: sqldedup.Postgres, Schema: schema, Retention: retention}).Driver()
		})
	})
}

// A commit the database refuses for the transaction's content matches
// dedup.ErrTxRefused, and a statement after a failed one is IsAborted
// (PostgreSQL through pgx's stdlib driver).
func TestCommitRefusedAndAborted(t *testing.T) {
	db, schema := postgres(t)
	store := migrated(t, db, sqldedup.Config{Dialect: sqldedup.Postgres, Schema: schema})
	ctx := testCtx(t)
	tx, err := store.Driver().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Driver().Rollback(ctx, tx) // released if the test fails first
	_, swallowed := tx.ExecContext(ctx, "SELECT 1/0")
	_, err = tx.ExecContext(ctx, "SELECT 1")
	if swallowed == nil || store.Driver().IsAborted(swallowed) || !store.Driver().IsAborted(err) {
		t.Fatalf("IsAborted(%v) = %v, IsAborted(%v) = %v; want false, true", swallowed, store.Driver().IsAborted(swallowed), err, store.Driver().IsAborted(err))
	}
	if err := store.Driver().Commit(ctx, tx); !errors.Is(err, dedup.ErrTxRefused) {
		t.Fatalf("commit of an aborted transaction = %v, want ErrTxRefused", err)
	}
	if err := store.Driver().Rollback(ctx, tx); err != nil {
		t.Fatalf("Rollback after Commit: %v", err)
	}
}

// SQLite refuses a commit that breaks a deferred foreign key: ErrTxRefused.
func TestCommitRefusedSQLite(t *testing.T) {
	db := sqliteFile(t)
	store := migrated(t, db, sqldedup.Config{Dialect: sqldedup.SQLite})
	ctx := testCtx(t)
	if _, err := db.ExecContext(ctx, `CREATE TABLE parent (k TEXT PRIMARY KEY);
		CREATE TABLE child (k TEXT REFERENCES parent (k) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	tx, err := store.Driver().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Driver().Rollback(ctx, tx)
	if _, err := tx.ExecContext(ctx, `INSERT INTO child VALUES ('orphan')`); err != nil {
		t.Fatal(err)
	}
	if err := store.Driver().Commit(ctx, tx); !errors.Is(err, dedup.ErrTxRefused) {
		t.Fatalf("commit breaking a deferred foreign key = %v, want ErrTxRefused", err)
	}
	// Nothing committed, and the connection is usable again.
	got := claimCommit(t, store, "s", rec("after", "x"))
	if got[0].State != dedup.StateNew {
		t.Fatalf("claim after the refused commit: %v", got[0].State)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM child`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("child rows after the refused commit: %d, %v", n, err)
	}
}
