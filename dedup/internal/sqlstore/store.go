// Package sqlstore is the machinery shared by the SQL stores, dedup/pgdedup
// and dedup/sqldedup: the claim algorithm, the configuration they share
// (also checked by dedup/migrate), and Store, the statements of both stores
// that do not depend on the driver (failure counts, cleanup and the
// janitor, the table's measurements and report, the schema check) over a
// driver-neutral DB.
package sqlstore

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/dedup"
)

// Querier is a store's database handle, or one of its transactions, as the
// shared operations use it. pgdedup adapts its pgx handle to it, sqldedup
// its database/sql handle.
type Querier interface {
	// Exec runs sql and returns the number of rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// Query runs sql; the caller closes the rows, which are valid only
	// when err is nil.
	Query(ctx context.Context, sql string, args ...any) (ScanRows, error)
	// QueryRow runs sql for its first row.
	QueryRow(ctx context.Context, sql string, args ...any) Row
}

// DB is a store's database handle: a Querier that begins transactions.
type DB interface {
	Querier
	// Begin starts a transaction with the driver's default options.
	Begin(ctx context.Context) (Tx, error)
}

// Tx is a transaction that DB.Begin started. Rollback is safe after Commit.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Row is one row of QueryRow: *sql.Row and pgx.Row both are.
type Row interface{ Scan(dest ...any) error }

// ScanRows are the rows of Querier.Query: *sql.Rows are.
type ScanRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// closeRows closes rows and returns err, or else the error that ended or
// closed them.
func closeRows(rows ScanRows, err error) error {
	if err == nil {
		err = rows.Err()
	}
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	return err
}

// Store is what pgdedup.Store and sqldedup.Store have in common: their
// tables, and the statements on them that do not depend on the driver
// (failure counts, cleanup, the table's measurements and report, the schema
// check). It is safe for concurrent use.
type Store struct {
	name      string // the package, which prefixes errors and logs
	db        DB
	postgres  bool
	display   string // the table as reports and errors name it
	plain     string // the table's unquoted name
	quoted    string // the record table, quoted and qualified
	failures  string // the failure table, quoted and qualified
	retention time.Duration
	batch     int
	stats     atomic.Pointer[dedup.TableStats] // the janitor's latest measurement
}

// New returns the shared part of the store name ("pgdedup" or "sqldedup")
// on db, with the validated settings s.
func New(name string, db DB, s Settings) *Store {
	st := &Store{name: name, db: db, postgres: s.Postgres, display: s.Table, plain: s.Table,
		quoted: quote(s.Table), failures: quote(s.Table + FailuresSuffix), retention: s.Retention, batch: s.CleanupBatchSize}
	if s.Postgres {
		st.display = s.Schema + "." + s.Table
		st.quoted, st.failures = quote(s.Schema)+"."+st.quoted, quote(s.Schema)+"."+st.failures
	}
	return st
}

// quote quotes a name that was validated as a plain identifier.
func quote(s string) string { return `"` + s + `"` }

// Postgres reports whether the database is PostgreSQL (else SQLite).
func (s *Store) Postgres() bool { return s.postgres }

// Table returns the record table, quoted, and qualified on PostgreSQL.
func (s *Store) Table() string { return s.quoted }

// Ph returns the placeholder of parameter n (1-based).
func (s *Store) Ph(n int) string {
	if s.postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?" + strconv.Itoa(n)
}

// Micros renders a time column as Unix microseconds, so that times cross
// every driver as int64.
func (s *Store) Micros(col string) string {
	if s.postgres {
		return "(extract(epoch FROM " + col + ") * 1000000)::bigint"
	}
	return col
}

// wrap prefixes err, unless nil, with the store's name and what it was
// doing.
func (s *Store) wrap(doing string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %s: %w", s.name, doing, err)
}
