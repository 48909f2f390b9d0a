package pgdedup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
	"github.com/idemq/idemq/internal/cfgerr"
)

// DB is what the store needs from a database handle. *pgxpool.Pool and
// *pgx.Conn satisfy it; a pool is the right choice for a Runner with
// Concurrency above 1.
type DB interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// DBTX is the statements part of DB: pgx.Tx, *pgx.Conn and *pgxpool.Pool
// all satisfy it (as does sqlc's generated DBTX).
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Store.
type Config struct {
	// Schema holds the table. It must be a plain SQL identifier
	// ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes). Defaults to "public".
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
	// transaction, so that cleanup never holds many locks for long.
	// Defaults to 1000.
	CleanupBatchSize int
	// StatsInterval is how often RunJanitor measures the table after its
	// cleanup (records per scope and the oldest record, for TableStats and
	// otelidemq's dedup gauges): one query that reads the whole table, so
	// keep it well above the time that takes. Negative: never. Defaults to
	// 5 min.
	StatsInterval time.Duration
	// CleanupPause is the pause between two batches of one Cleanup, so
	// that a backlog of expired records (after a janitor outage, or the
	// first cleanup of a large table) is deleted at a bounded pace and does
	// not take a busy database from the claims: at most CleanupBatchSize
	// records per CleanupPause plus the batch's own time (with the
	// defaults, at most 100,000 records/s; docs/performance.md has the
	// measurements). It must leave the janitor faster than records are
	// written: raise CleanupBatchSize or lower the pause if more expire
	// per second. Defaults to 10 ms; a negative value means no pause.
	CleanupPause time.Duration
	// Logger receives the janitor's logs. Defaults to a logger that
	// discards everything.
	Logger *slog.Logger
	// Partitioned says that the table is partitioned by day of
	// processed_at (dedup/migrate's migrations 004 and 005, which Migrate
	// applies when this is set). A claim then takes an advisory lock per key and
	// records a key only when no partition holds it, and Cleanup creates
	// partitions ahead and drops those whose every record expired, instead
	// of deleting rows. A partitioned store also works on a table not yet
	// partitioned (it cleans it row by row), so a deployment can switch
	// first and partition the table afterwards: docs/operations.md.
	// Defaults to false.
	Partitioned bool
	// Now is the store's clock: the processed-at time of the records it
	// writes (and so their partition), their expiry, and which records
	// have expired. Defaults to time.Now.
	Now func() time.Time
}

// The default schema and table (Config.Schema, Config.Table): the names that
// dedup/migrate, the idemq command and SQL of your own refer to when they
// are not set.
const (
	DefaultSchema = "public"
	DefaultTable  = "processed_messages"
)

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Schema = cmp.Or(c.Schema, DefaultSchema)
	c.Table = cmp.Or(c.Table, DefaultTable)
	c.Retention = cmp.Or(c.Retention, dedup.DefaultRetention)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, time.Minute)
	c.CleanupBatchSize = cmp.Or(c.CleanupBatchSize, 1000)
	c.StatsInterval = cmp.Or(c.StatsInterval, 5*time.Minute)
	c.CleanupPause = cmp.Or(c.CleanupPause, 10*time.Millisecond)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Store is the PostgreSQL deduplication store of the transactional path:
// hand it to consumer.Transactional, which drives it through its Driver
// (dedupdriver.Tx[pgx.Tx]). It is safe for concurrent use.
type Store struct {
	db     DB
	cfg    Config
	q      queries
	shared *sqlstore.Store // the statements pgdedup shares with sqldedup

	results queuedResults // StoreResults' results, until their commit

	retention any // cfg.Retention in microseconds, boxed once for the claims' arguments
}

// New returns a Store over db. It validates cfg; it does not touch the
// database (call Migrate, or apply the SQL of Migrations yourself).
func New(db DB, cfg Config) (*Store, error) {
	l := cfgerr.List{Prefix: "pgdedup.Config."}
	if db == nil {
		l.Include(&idemq.ConfigError{Field: "pgdedup.New(db)", Reason: "nil"})
	}
	cfg = cfg.WithDefaults()
	set := sqlstore.Settings{
		Postgres: true, Schema: cfg.Schema, Table: cfg.Table, Retention: cfg.Retention,
		CleanupInterval: cfg.CleanupInterval, CleanupBatchSize: cfg.CleanupBatchSize,
	}
	set.Validate(&l)
	if err := l.Err(); err != nil {
		return nil, err
	}
	return &Store{db: db, cfg: cfg, q: newQueries(cfg.Schema, cfg.Table, cfg.Partitioned), retention: cfg.Retention.Microseconds(),
		shared: sqlstore.New("pgdedup", conn{db}, set)}, nil
}

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// Begin implements dedupdriver.Tx. It starts a READ COMMITTED transaction
// (the default), which Claim relies on to see concurrent commits.
func (s txDriver) Begin(ctx context.Context) (pgx.Tx, error) { return s.db.Begin(ctx) }

// Commit implements dedupdriver.Tx. When the database refused the commit for
// the transaction's content, the error matches dedup.ErrTxRefused: a
// transaction that had failed (pgx.ErrTxCommitRollback, after a handler
// swallowed an error) or a deferred constraint the server rejected. Any other
// error (a lost connection) leaves the outcome unknown.
//
// Results that StoreResults queued for tx are written by the same pipelined
// round trip as the COMMIT. tx is closed when Commit returns, whatever it
// returns.
func (s txDriver) Commit(ctx context.Context, tx pgx.Tx) error {
	if rs := s.results.take(tx); len(rs) > 0 {
		return s.commitWithResults(ctx, tx, rs)
	}
	return refusedCommit(tx.Commit(ctx))
}

// refusedCommit marks the error of a commit with dedup.ErrTxRefused when the
// server refused the transaction's content, and returns any other error as
// it is (the outcome is unknown).
func refusedCommit(err error) error {
	var pgErr *pgconn.PgError
	if errors.Is(err, pgx.ErrTxCommitRollback) || (errors.As(err, &pgErr) && !sqlstore.PostgresTransient(pgErr.Code)) {
		return fmt.Errorf("%w: %w", dedup.ErrTxRefused, err)
	}
	return err
}

// Rollback implements dedupdriver.Tx; it is safe after Commit. It drops the
// results StoreResults queued for tx.
func (s txDriver) Rollback(ctx context.Context, tx pgx.Tx) error {
	s.results.take(tx)
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// IsAborted implements dedupdriver.Tx: SQLSTATE 25P02, the error of
// any statement sent after an earlier one failed in the same transaction.
func (s txDriver) IsAborted(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && sqlstore.PostgresAborted(pgErr.Code)
}

// Failed implements dedupdriver.Tx: the transaction status of tx's
// connection, as of the last reply, is failed ('E'). It sends nothing.
func (s txDriver) Failed(tx pgx.Tx) bool {
	c := tx.Conn()
	return c != nil && c.PgConn().TxStatus() == 'E'
}

// Ended implements dedupdriver.Tx: the connection of tx is open and
// its transaction status is 'I' (idle, no transaction), which a handler's
// COMMIT or ROLLBACK through tx leaves. It costs no round trip.
func (s txDriver) Ended(tx pgx.Tx) bool {
	c := tx.Conn()
	return c != nil && !c.IsClosed() && c.PgConn().TxStatus() == 'I'
}

// ForgetEnded implements dedupdriver.Tx: one statement, in autocommit
// on the connection of tx, deletes the records of keys whose xmin (the
// inserting or renewing transaction) is that of culprit's record.
func (s txDriver) ForgetEnded(ctx context.Context, tx pgx.Tx, scope, culprit string, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, s.q.forgetEnded, s.planned(scope, culprit, keys)...); err != nil {
		return fmt.Errorf("pgdedup: forget the records of an ended transaction: %w", err)
	}
	return nil
}

// Claim implements dedupdriver.Tx. New keys are inserted in ascending key
// order in one statement, so concurrent batches lock them in the same order.
// A key held by a concurrent uncommitted transaction makes the statement wait
// for that transaction's outcome. An expired record (older than Retention,
// not yet deleted by the janitor) counts as absent and is claimed anew.
func (s txDriver) Claim(ctx context.Context, tx pgx.Tx, scope string, recs []dedup.Record) ([]dedup.Claim, error) {
	return s.claim(ctx, tx, scope, recs, nil)
}

// IsTransient implements dedupdriver.Tx. Only typed driver errors are
// transient: a *pgconn.PgError whose SQLSTATE names a condition of the
// database (sqlstore.PostgresTransient), a *pgconn.ConnectError, and a
// pgconn error for a statement that was never sent. Anything else is the
// message's own failure, counted against its attempts, even a context
// deadline (a handler past its HandlerTimeout) or another library's error
// that implements net.Error. A record refused for want of a partition
// (noPartition) is transient too: the janitor, not the message, is at
// fault, and creates it on its next run. It is safe for concurrent use.
func (s txDriver) IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return sqlstore.PostgresTransient(pgErr.Code) || s.noPartition(pgErr)
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || pgconn.SafeToRetry(err)
}

// noPartition reports whether err is PostgreSQL's refusal of a record for
// which the table has no partition (23514 without a constraint, naming the
// table): the janitor has not created the clock's day.
func (s *Store) noPartition(err *pgconn.PgError) bool {
	return err.Code == "23514" && err.ConstraintName == "" && err.Message == `no partition of relation "`+s.cfg.Table+`" found for row`
}

// MarkProcessedTx records key as processed in a transaction the caller owns,
// for code that runs its own transactions instead of a Runner:
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	state, err := store.MarkProcessedTx(ctx, tx, "billing", key, body)
//	if err != nil { return err }             // includes *dedup.MismatchError
//	if state == dedup.StateDone { return nil } // duplicate: skip the effect
//	... business writes in tx ...
//	return tx.Commit(ctx)
//
// It returns dedup.StateNew when the caller must perform the effect in tx,
// dedup.StateDone for a duplicate, and a *dedup.MismatchError (matching
// dedup.ErrPayloadMismatch) when key was processed with another payload.
func (s *Store) MarkProcessedTx(ctx context.Context, tx pgx.Tx, scope, key string, payload []byte) (dedup.State, error) {
	return sqlstore.MarkProcessed(scope, key, payload, func(recs []dedup.Record) ([]dedup.Claim, error) {
		return s.claim(ctx, tx, scope, recs, nil)
	})
}

// Inspect returns the record of key in scope, or dedup.ErrNotFound.
func (s *Store) Inspect(ctx context.Context, scope, key string) (dedup.Entry, error) {
	e := dedup.Entry{Scope: scope, Key: key}
	var hash []byte
	err := s.db.QueryRow(ctx, s.q.inspect, s.planned(scope, key)...).Scan(&hash, &e.ProcessedAt, &e.ExpiresAt, &e.Result)
	if errors.Is(err, pgx.ErrNoRows) {
		return e, dedup.ErrNotFound
	}
	if err != nil {
		return e, fmt.Errorf("pgdedup: inspect %q: %w", key, err)
	}
	if e.PayloadHash, err = dedup.HashFromBytes(hash); err != nil {
		return e, err
	}
	return e, nil
}

// Purge deletes the record of key in scope, so that its next delivery runs
// the handler again. It reports whether a record existed.
func (s *Store) Purge(ctx context.Context, scope, key string) (bool, error) {
	tag, err := s.db.Exec(ctx, s.q.unclaim, s.planned(scope, key)...)
	if err != nil {
		return false, fmt.Errorf("pgdedup: purge %q: %w", key, err)
	}
	return tag.RowsAffected() > 0, nil
}
