package outbox

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup/sqldedup"
)

//go:embed migrations/*/*.sql
var migrations embed.FS

// upSQL returns the "Up" sections of the dialect's migrations, in order.
func upSQL(d sqldedup.Dialect) ([]string, error) {
	var dir string
	switch d {
	case sqldedup.Postgres:
		dir = "migrations/postgres"
	case sqldedup.SQLite:
		dir = "migrations/sqlite"
	default:
		return nil, fmt.Errorf("outbox: unknown dialect %q", d)
	}
	names, err := fs.Glob(migrations, dir+"/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names) // file names start with a zero-padded version
	ups := make([]string, 0, len(names))
	for _, name := range names {
		b, err := fs.ReadFile(migrations, name)
		if err != nil {
			return nil, err
		}
		up, _, ok := strings.Cut(string(b), "-- +goose Down")
		if !ok {
			return nil, fmt.Errorf("outbox: migration %s has no -- +goose Down section", name)
		}
		_, up, _ = strings.Cut(up, "-- +goose Up")
		ups = append(ups, strings.TrimSpace(up))
	}
	return ups, nil
}

// MigrationSQL returns the SQL that creates the outbox table for dialect
// (sqldedup.Postgres or sqldedup.SQLite), for review or for a migration
// tool. Every PostgreSQL statement is idempotent (IF NOT EXISTS, OR
// REPLACE); on SQLite, run the ADD COLUMN statements once.
func MigrationSQL(d sqldedup.Dialect) (string, error) {
	return Schema("").MigrationSQL(d)
}

// MigrationSQL is the package-level MigrationSQL with the table in schema
// s: on PostgreSQL the script first creates s and sets the session's
// search_path to it.
func (s Schema) MigrationSQL(d sqldedup.Dialect) (string, error) {
	if err := s.check(d); err != nil {
		return "", err
	}
	ups, err := upSQL(d)
	if err != nil {
		return "", err
	}
	if s != "" {
		ups = append([]string{s.enterSQL(false)}, ups...)
	}
	return strings.Join(ups, "\n\n") + "\n", nil
}

// check refuses a schema on SQLite.
func (s Schema) check(d sqldedup.Dialect) error {
	if s != "" && d == sqldedup.SQLite {
		return &idemq.ConfigError{Field: "outbox.Schema", Reason: fmt.Sprintf("%q: SQLite has no schemas", string(s))}
	}
	return nil
}

// enterSQL creates schema s and puts it first on the search path, for the
// transaction (local) or the session, so that the migrations' unqualified
// names land in it.
func (s Schema) enterSQL(local bool) string {
	q := pgx.Identifier{string(s)}.Sanitize()
	set := "SET search_path TO "
	if local {
		set = "SET LOCAL search_path TO "
	}
	return "CREATE SCHEMA IF NOT EXISTS " + q + ";\n" + set + q + ";"
}

// PgxExecer is what MigrateTx needs of pgx: pgx.Tx fits (and *pgx.Conn,
// *pgxpool.Pool).
type PgxExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SQLExecer is what MigrateTxSQL needs of database/sql: *sql.Tx fits (and
// *sql.Conn, *sql.DB).
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// addColumn matches the SQLite migrations' ADD COLUMN statements, which
// have no IF NOT EXISTS.
var addColumn = regexp.MustCompile(`^ALTER TABLE (\w+) ADD COLUMN (\w+) `)

// MigrateTx creates or updates the outbox table in tx, a PostgreSQL
// transaction, in the first schema of its search_path. The statements are
// idempotent, so running it again, or from two processes one after the
// other, is safe.
func MigrateTx(ctx context.Context, tx PgxExecer) error {
	return Schema("").MigrateTx(ctx, tx)
}

// MigrateTx is the package-level MigrateTx with the table in schema s,
// which it creates if needed; it sets tx's search_path to s (SET LOCAL).
func (s Schema) MigrateTx(ctx context.Context, tx PgxExecer) error {
	ups, err := upSQL(sqldedup.Postgres)
	if err != nil {
		return err
	}
	if s != "" {
		ups = append([]string{s.enterSQL(true)}, ups...)
	}
	for _, up := range ups {
		if _, err := tx.Exec(ctx, up); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
	}
	return nil
}

// MigrateTxSQL is MigrateTx for a database/sql transaction of dialect d
// (PostgreSQL or SQLite).
func MigrateTxSQL(ctx context.Context, tx SQLExecer, d sqldedup.Dialect) error {
	return Schema("").MigrateTxSQL(ctx, tx, d)
}

// MigrateTxSQL is the package-level MigrateTxSQL with the table in schema
// s (PostgreSQL only).
func (s Schema) MigrateTxSQL(ctx context.Context, tx SQLExecer, d sqldedup.Dialect) error {
	if err := s.check(d); err != nil {
		return err
	}
	ups, err := upSQL(d)
	if err != nil {
		return err
	}
	if s != "" {
		ups = append([]string{s.enterSQL(true)}, ups...)
	}
	for _, up := range ups {
		if m := addColumn.FindStringSubmatch(up); m != nil && d == sqldedup.SQLite {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?) WHERE name = ?`, m[1], m[2]).Scan(&n); err != nil {
				return fmt.Errorf("outbox: migrate: %w", err)
			}
			if n > 0 {
				continue // applied before
			}
		}
		if _, err := tx.ExecContext(ctx, up); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
	}
	return nil
}

// PgxBeginner is what Migrate needs of a pgx pool or connection
// (*pgxpool.Pool, *pgx.Conn).
type PgxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate creates or updates the outbox table on PostgreSQL in one
// transaction, through a *pgxpool.Pool or *pgx.Conn, in the first schema of
// the search_path. It takes a lock on the table name first, so that two
// processes migrating at once do not collide.
func Migrate(ctx context.Context, db PgxBeginner) error {
	return Schema("").Migrate(ctx, db)
}

// Migrate is the package-level Migrate with the table in schema s, which
// it creates if needed.
func (s Schema) Migrate(ctx context.Context, db PgxBeginner) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, s.table()); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	if err := s.MigrateTx(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}

// MigrateSQL is Migrate through database/sql, for a *sql.DB of dialect d
// (PostgreSQL or SQLite).
func MigrateSQL(ctx context.Context, db *sql.DB, d sqldedup.Dialect) error {
	return Schema("").MigrateSQL(ctx, db, d)
}

// MigrateSQL is the package-level MigrateSQL with the table in schema s
// (PostgreSQL only).
func (s Schema) MigrateSQL(ctx context.Context, db *sql.DB, d sqldedup.Dialect) error {
	if err := s.check(d); err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if d == sqldedup.Postgres {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, s.table()); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
	}
	if err := s.MigrateTxSQL(ctx, tx, d); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}
