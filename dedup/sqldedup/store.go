package sqldedup

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
	"github.com/idemq/idemq/internal/cfgerr"
)

// DB is what the store needs from a database handle: *sql.DB and *sql.Conn
// satisfy it, as do wrappers that embed them (sqlx.DB).
type DB interface {
	Querier
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Querier is the statements part of DB: *sql.Tx, *sql.DB and *sql.Conn
// all satisfy it (as do sqlx's types and sqlc's generated DBTX).
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Config configures a Store.
type Config struct {
	// Dialect is the database's SQL dialect: SQLite or Postgres. Required.
	Dialect Dialect
	// Schema holds the table (Postgres only; it must be empty for SQLite).
	// It must be a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63
	// bytes). Defaults to "public" for Postgres.
	Schema string
	// Table is the name of the processed-message table, a plain SQL
	// identifier of at most 50 bytes. Defaults to "processed_messages".
	Table string
	// Retention is how long a record is kept: a redelivery later than this
	// is no longer recognised, and the janitor deletes the record. At least
	// 1 s. Defaults to dedup.DefaultRetention (8 days).
	Retention time.Duration
	// CleanupInterval is how often RunJanitor deletes expired records.
	// Defaults to 1 min.
	CleanupInterval time.Duration
	// CleanupBatchSize is the number of expired records deleted per
	// transaction, so that cleanup never holds the write lock (SQLite) or
	// many row locks (PostgreSQL) for long. Defaults to 1000.
	CleanupBatchSize int
	// StatsInterval is how often RunJanitor measures the table after its
	// cleanup (records per scope and the oldest record, for TableStats and
	// otelidemq's dedup gauges): one query that reads the whole table, so
	// keep it well above the time that takes. Negative: never. Defaults to
	// 5 min.
	StatsInterval time.Duration
	// Logger receives the janitor's logs. Defaults to a logger that
	// discards everything.
	Logger *slog.Logger
}

// The default schema (Postgres only) and table (Config.Schema,
// Config.Table): the names that dedup/migrate, the idemq command and SQL of
// your own refer to when they are not set.
const (
	DefaultSchema = "public"
	DefaultTable  = "processed_messages"
)

// WithDefaults returns a copy of c with every zero field set to its default.
// Schema gets its default only for Postgres.
func (c Config) WithDefaults() Config {
	if c.Dialect == Postgres {
		c.Schema = cmp.Or(c.Schema, DefaultSchema)
	}
	c.Table = cmp.Or(c.Table, DefaultTable)
	c.Retention = cmp.Or(c.Retention, dedup.DefaultRetention)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, time.Minute)
	c.CleanupBatchSize = cmp.Or(c.CleanupBatchSize, 1000)
	c.StatsInterval = cmp.Or(c.StatsInterval, 5*time.Minute)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// validate reports every invalid field of c, and returns the fields that
// sqlstore shares with pgdedup.
func (c Config) validate() (sqlstore.Settings, error) {
	l := cfgerr.List{Prefix: "sqldedup.Config."}
	switch c.Dialect {
	case Postgres: // Schema is checked with the fields pgdedup shares
	case SQLite:
		if c.Schema != "" {
			l.Addf("Schema", "%q is set, but SQLite has no schemas (leave it empty)", c.Schema)
		}
	case "":
		l.Add("Dialect", "required (sqldedup.SQLite or sqldedup.Postgres)")
	default:
		l.Addf("Dialect", "unknown value %q (want %q or %q)", c.Dialect, SQLite, Postgres)
	}
	set := sqlstore.Settings{
		Postgres: c.Dialect == Postgres, Schema: c.Schema, Table: c.Table, Retention: c.Retention,
		CleanupInterval: c.CleanupInterval, CleanupBatchSize: c.CleanupBatchSize,
	}
	set.Validate(&l)
	return set, l.Err()
}

// Store is the database/sql deduplication store of the transactional path:
// hand it to consumer.Transactional, which drives it through its Driver
// (dedupdriver.Tx[*sql.Tx]), so handlers receive the *sql.Tx that also
// records their message. It is safe for concurrent use.
type Store struct {
	db     DB
	cfg    Config
	q      queries
	shared *sqlstore.Store // the statements sqldedup shares with pgdedup
}

// New returns a Store over db. It validates cfg; it does not touch the
// database (call Migrate, or apply dedup/migrate's SQL yourself).
func New(db DB, cfg Config) (*Store, error) {
	var l cfgerr.List
	if db == nil {
		l.Include(&idemq.ConfigError{Field: "sqldedup.New(db)", Reason: "nil"})
	}
	cfg = cfg.WithDefaults()
	set, err := cfg.validate()
	l.Include(err)
	if err := l.Err(); err != nil {
		return nil, err
	}
	shared := sqlstore.New("sqldedup", conn{q: db}, set)
	return &Store{db: db, cfg: cfg, q: queries{shared}, shared: shared}, nil
}

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// Begin implements dedupdriver.Tx. It starts a transaction with the driver's
// default options: READ COMMITTED on PostgreSQL, which Claim relies on to see
// concurrent commits; on SQLite, BEGIN IMMEDIATE when the connection was
// opened with _txlock=immediate (see OpenSQLite), else a deferred
// transaction whose first statement (Claim's insert) takes the write lock.
func (s txDriver) Begin(ctx context.Context) (*sql.Tx, error) { return s.db.BeginTx(ctx, nil) }

// Commit implements dedupdriver.Tx. Any error, including sql.ErrTxDone for a
// transaction that database/sql already rolled back because its context
// ended, means the records in tx must not be acknowledged. When the database
// refused the commit for the transaction's content, the error matches
// dedup.ErrTxRefused: a deferred constraint (a driver error with a
// non-transient SQLState, or SQLite's SQLITE_CONSTRAINT), or a PostgreSQL
// transaction that had failed, which pgx's stdlib driver and lib/pq report as
// a rollback.
//
// On PostgreSQL, Commit first checks, in one round trip, that tx is still
// open: a handler that sent COMMIT or ROLLBACK through tx left the rest of
// its batch in autocommit, and the commit is then refused (dedup.ErrTxRefused)
// so that the runner finds and blames that handler. database/sql gives no
// access to the connection's transaction status without a round trip, so
// this check runs once per commit, not after every handler as pgdedup's.
func (s txDriver) Commit(ctx context.Context, tx *sql.Tx) error {
	if s.cfg.Dialect == Postgres {
		if err := s.checkOpen(ctx, tx); err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	err := tx.Commit()
	if err != nil && s.refused(err) {
		return fmt.Errorf("%w: %w", dedup.ErrTxRefused, err)
	}
	return err
}

// errTxEnded is the refusal of a transaction a handler ended itself.
var errTxEnded = errors.New("sqldedup: the transaction was ended by a statement sent through it (COMMIT or ROLLBACK in a handler)")

// checkOpen returns an error matching dedup.ErrTxRefused when tx is no
// longer open on PostgreSQL (SAVEPOINT is refused outside a transaction
// block with SQLSTATE 25P01), and any other error of the check except the
// 25P02 of a failed transaction, whose commit reports it.
func (s *Store) checkOpen(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `SAVEPOINT idemq_open; RELEASE SAVEPOINT idemq_open`)
	var state interface{ SQLState() string }
	switch {
	case err == nil || (txDriver{Store: s}).IsAborted(err):
		return nil
	case errors.As(err, &state) && state.SQLState() == "25P01":
		return fmt.Errorf("%w: %w", dedup.ErrTxRefused, errTxEnded)
	default:
		return fmt.Errorf("sqldedup: check that the transaction is open: %w", err)
	}
}

// Rollback implements dedupdriver.Tx; it is safe after Commit.
func (s txDriver) Rollback(_ context.Context, tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// Claim implements dedupdriver.Tx. New keys are inserted in ascending key
// order, so concurrent batches take them in the same order. On PostgreSQL a
// key held by a concurrent uncommitted transaction makes the insert wait for
// that transaction's outcome; on SQLite the other transaction cannot exist,
// since SQLite admits one writer at a time. An expired record (older than
// Retention, not yet deleted by the janitor) counts as absent and is claimed
// anew.
func (s txDriver) Claim(ctx context.Context, tx *sql.Tx, scope string, recs []dedup.Record) ([]dedup.Claim, error) {
	return s.claim(ctx, tx, scope, recs)
}

// MarkProcessedTx records key as processed in a transaction the caller owns,
// for code that runs its own transactions instead of a Runner:
//
//	tx, _ := db.BeginTx(ctx, nil)
//	defer tx.Rollback()
//	state, err := store.MarkProcessedTx(ctx, tx, "billing", key, body)
//	if err != nil { return err }             // includes *dedup.MismatchError
//	if state == dedup.StateDone { return nil } // duplicate: skip the effect
//	... business writes in tx ...
//	return tx.Commit()
//
// It returns dedup.StateNew when the caller must perform the effect in tx,
// dedup.StateDone for a duplicate, and a *dedup.MismatchError (matching
// dedup.ErrPayloadMismatch) when key was processed with another payload.
// On SQLite, call it before any other statement of a deferred transaction
// (or open the database with OpenSQLite), so that it takes the write lock
// first.
func (s *Store) MarkProcessedTx(ctx context.Context, tx *sql.Tx, scope, key string, payload []byte) (dedup.State, error) {
	return sqlstore.MarkProcessed(scope, key, payload, func(recs []dedup.Record) ([]dedup.Claim, error) {
		return s.claim(ctx, tx, scope, recs)
	})
}

// Inspect returns the record of key in scope, or dedup.ErrNotFound. An
// expired record that the janitor has not deleted yet is returned with its
// past ExpiresAt.
func (s *Store) Inspect(ctx context.Context, scope, key string) (dedup.Entry, error) {
	e := dedup.Entry{Scope: scope, Key: key}
	var (
		hash               []byte
		processed, expires int64
	)
	err := s.db.QueryRowContext(ctx, s.q.inspect(), scope, key).Scan(&hash, &processed, &expires, &e.Result)
	if errors.Is(err, sql.ErrNoRows) {
		return e, dedup.ErrNotFound
	}
	if err != nil {
		return e, fmt.Errorf("sqldedup: inspect %q: %w", key, err)
	}
	if e.PayloadHash, err = dedup.HashFromBytes(hash); err != nil {
		return e, err
	}
	e.ProcessedAt, e.ExpiresAt = time.UnixMicro(processed), time.UnixMicro(expires)
	return e, nil
}

// Purge deletes the record of key in scope, so that its next delivery runs
// the handler again. It reports whether a record existed.
func (s *Store) Purge(ctx context.Context, scope, key string) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.q.deleteKey(), scope, key)
	if err != nil {
		return false, fmt.Errorf("sqldedup: purge %q: %w", key, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("sqldedup: purge %q: %w", key, err)
	}
	return n > 0, nil
}
