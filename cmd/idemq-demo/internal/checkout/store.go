package checkout

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
)

// OpeningBalance is every account's balance, in cents, before any charge.
const OpeningBalance = 100_000_000

// AccountID names account i (0-based) of the accounts a store creates.
func AccountID(i int) string { return fmt.Sprintf("acct-%03d", i) }

// Store holds the accounts, the ledger and the deduplication records of the
// worker, in one database so that a charge, its ledger row and its record
// commit together. It is safe for concurrent use.
type Store interface {
	// Path is the runner's transactional path: the deduplication store
	// with the checkout handler.
	Path() consumer.Path
	// Ledger reads the figures the demo's proof checks.
	Ledger(ctx context.Context) (Ledger, error)
	// Close releases the database.
	Close() error
}

// Ledger sums up the ledger and the accounts.
type Ledger struct {
	// Rows is the number of ledger rows: one per charge.
	Rows int64
	// Orders is the number of distinct orders in the ledger.
	Orders int64
	// Total is the sum of the charged amounts, in cents.
	Total int64
	// DoubleCharged is the number of orders with more than one ledger row.
	// The ledger has no unique constraint on order_id on purpose, so that
	// a second run of the handler would show here instead of failing.
	DoubleCharged int64
	// Debited is what the accounts lost: the sum of OpeningBalance minus
	// balance. It equals Total when every debit committed with its ledger
	// row.
	Debited int64
}

const sqliteSchema = `
CREATE TABLE IF NOT EXISTS accounts (
    id      TEXT    PRIMARY KEY,
    balance INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS ledger (
    order_id   TEXT    NOT NULL, -- no UNIQUE on purpose: the proof counts rows
    account    TEXT    NOT NULL REFERENCES accounts (id),
    amount     INTEGER NOT NULL,
    charged_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT;
CREATE INDEX IF NOT EXISTS ledger_order_id_idx ON ledger (order_id);`

// SQLiteStore is the Store on a SQLite file, through database/sql and
// dedup/sqldedup. Handlers get a *sql.Tx.
type SQLiteStore struct {
	DB    *sql.DB
	Dedup *sqldedup.Store
	// Events is the destination of the "order charged" events the
	// charges publish through the outbox; "" publishes none. Set it with
	// EnableEvents.
	Events string
}

// OpenSQLite opens (creating if needed) the SQLite database at path with
// sqldedup.OpenSQLite, applies the dedup migrations and the checkout tables,
// and creates accounts accounts with OpeningBalance. The modernc.org/sqlite
// driver must be registered (a blank import); the command in cmd/internal/checkout
// does that.
func OpenSQLite(ctx context.Context, path string, accounts int) (*SQLiteStore, error) {
	db, err := sqldedup.OpenSQLite(ctx, path)
	if err != nil {
		return nil, err
	}
	s, err := setupSQLite(ctx, db, accounts)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("checkout: set up %s: %w", path, err)
	}
	return s, nil
}

func setupSQLite(ctx context.Context, db *sql.DB, accounts int) (*SQLiteStore, error) {
	store, err := sqldedup.New(db, sqldedup.Config{Dialect: sqldedup.SQLite})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() // safe after commit
	if _, err := tx.ExecContext(ctx, sqliteSchema); err != nil {
		return nil, err
	}
	for i := range accounts {
		if _, err := tx.ExecContext(ctx, `INSERT INTO accounts (id, balance) VALUES (?, ?) ON CONFLICT DO NOTHING`,
			AccountID(i), OpeningBalance); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return &SQLiteStore{DB: db, Dedup: store}, nil
}

// Path implements Store.
func (s *SQLiteStore) Path() consumer.Path {
	return consumer.Transactional(s.Dedup, withEvents(ChargeSQL, s.Events))
}

// Ledger implements Store.
func (s *SQLiteStore) Ledger(ctx context.Context) (Ledger, error) {
	return readLedger(ctx, func(q string, dest ...any) error { return s.DB.QueryRowContext(ctx, q).Scan(dest...) },
		"accounts", "ledger")
}

// Close implements Store.
func (s *SQLiteStore) Close() error { return s.DB.Close() }

// PostgresStore is the Store on PostgreSQL, through pgx and dedup/pgdedup.
// Handlers get a pgx.Tx.
type PostgresStore struct {
	Pool   *pgxpool.Pool
	Dedup  *pgdedup.Store
	Schema string
	// Events is the destination of the "order charged" events the
	// charges publish through the outbox (its table is in Schema, the
	// pool's search_path); "" publishes none. Set it with EnableEvents.
	Events string
}

// OpenPostgres connects to databaseURL, creates schema with the checkout
// tables and accounts accounts with OpeningBalance, and applies the dedup
// migrations in it.
func OpenPostgres(ctx context.Context, databaseURL, schema string, accounts int) (*PostgresStore, error) {
	poolCfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("checkout: connect: %w", err)
	}
	if !strings.Contains(databaseURL, "pool_max_conns") {
		// Room for the worker's lanes (4 by default) plus the janitor and
		// the ledger queries: the runner refuses a pool no larger than its
		// Concurrency.
		poolCfg.MaxConns = max(poolCfg.MaxConns, 16)
	}
	// The outbox table (EnableEvents) is found through the search_path;
	// the checkout and dedup tables are named with their schema.
	poolCfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return nil, fmt.Errorf("checkout: connect: %w", err)
	}
	s, err := setupPostgres(ctx, pool, schema, accounts)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("checkout: set up schema %s: %w", schema, err)
	}
	return s, nil
}

func setupPostgres(ctx context.Context, pool *pgxpool.Pool, schema string, accounts int) (*PostgresStore, error) {
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil { // also creates the schema
		return nil, err
	}
	acc, ledger := pgx.Identifier{schema, "accounts"}.Sanitize(), pgx.Identifier{schema, "ledger"}.Sanitize()
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS ` + acc + ` (id text PRIMARY KEY, balance bigint NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + ledger + ` (
    order_id   text        NOT NULL, -- no UNIQUE on purpose: the proof counts rows
    account    text        NOT NULL REFERENCES ` + acc + ` (id),
    amount     bigint      NOT NULL,
    charged_at timestamptz NOT NULL DEFAULT now()
)`,
		`CREATE INDEX IF NOT EXISTS ledger_order_id_idx ON ` + ledger + ` (order_id)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return nil, err
		}
	}
	ids := make([]string, accounts)
	for i := range ids {
		ids[i] = AccountID(i)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+acc+` (id, balance) SELECT unnest($1::text[]), $2 ON CONFLICT DO NOTHING`,
		ids, OpeningBalance); err != nil {
		return nil, err
	}
	return &PostgresStore{Pool: pool, Dedup: store, Schema: schema}, nil
}

// Path implements Store.
func (s *PostgresStore) Path() consumer.Path {
	return consumer.Transactional(s.Dedup, withEvents(ChargePgx(s.Schema), s.Events))
}

// Ledger implements Store.
func (s *PostgresStore) Ledger(ctx context.Context) (Ledger, error) {
	return readLedger(ctx, func(q string, dest ...any) error { return s.Pool.QueryRow(ctx, q).Scan(dest...) },
		pgx.Identifier{s.Schema, "accounts"}.Sanitize(), pgx.Identifier{s.Schema, "ledger"}.Sanitize())
}

// Close implements Store.
func (s *PostgresStore) Close() error { s.Pool.Close(); return nil }

// readLedger runs the proof queries through queryRow (SQL common to SQLite
// and PostgreSQL).
func readLedger(_ context.Context, queryRow func(q string, dest ...any) error, accounts, ledger string) (Ledger, error) {
	var l Ledger
	if err := queryRow(`SELECT count(*), count(DISTINCT order_id), coalesce(sum(amount), 0) FROM `+ledger,
		&l.Rows, &l.Orders, &l.Total); err != nil {
		return l, fmt.Errorf("checkout: read ledger: %w", err)
	}
	if err := queryRow(`SELECT count(*) FROM (SELECT order_id FROM `+ledger+` GROUP BY order_id HAVING count(*) > 1) AS d`,
		&l.DoubleCharged); err != nil {
		return l, fmt.Errorf("checkout: read ledger: %w", err)
	}
	if err := queryRow(fmt.Sprintf(`SELECT coalesce(sum(%d - balance), 0) FROM %s`, OpeningBalance, accounts), &l.Debited); err != nil {
		return l, fmt.Errorf("checkout: read accounts: %w", err)
	}
	return l, nil
}
