package outbox

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
// tool. Every statement is idempotent (IF NOT EXISTS, OR REPLACE).
func MigrationSQL(d sqldedup.Dialect) (string, error) {
	ups, err := upSQL(d)
	if err != nil {
		return "", err
	}
	return strings.Join(ups, "\n\n") + "\n", nil
}

// pgxExecer is what MigrateTx needs of pgx (pgx.Tx, *pgx.Conn, *pgxpool.Pool).
type pgxExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// sqlExecer is what MigrateTx needs of database/sql (*sql.Tx, *sql.DB).
type sqlExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// MigrateTx creates or updates the outbox table in tx: a pgx.Tx (or
// anything with pgx's Exec: PostgreSQL), or a *sql.Tx of dialect d. The
// statements are idempotent, so running it again, or from two processes one
// after the other, is safe.
func MigrateTx(ctx context.Context, tx any, d sqldedup.Dialect) error {
	ups, err := upSQL(d)
	if err != nil {
		return err
	}
	for _, up := range ups {
		switch e := tx.(type) {
		case pgxExecer:
			_, err = e.Exec(ctx, up)
		case sqlExecer:
			_, err = e.ExecContext(ctx, up)
		default:
			return fmt.Errorf("%w: %T", ErrUnsupportedTx, tx)
		}
		if err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
	}
	return nil
}

// pgxBeginner is what Migrate needs of a pgx pool or connection.
type pgxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate creates or updates the outbox table in one transaction, through
// a *pgxpool.Pool or *pgx.Conn (PostgreSQL), or a *sql.DB of dialect d.
// PostgreSQL's migration takes a lock on the table name first, so that two
// processes migrating at once do not collide.
func Migrate(ctx context.Context, db any, d sqldedup.Dialect) error {
	switch b := db.(type) {
	case pgxBeginner:
		tx, err := b.Begin(ctx)
		if err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('`+Table+`'))`); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		if err := MigrateTx(ctx, tx, sqldedup.Postgres); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		return nil
	case *sql.DB:
		tx, err := b.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		defer func() { _ = tx.Rollback() }()
		if d == sqldedup.Postgres {
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('`+Table+`'))`); err != nil {
				return fmt.Errorf("outbox: migrate: %w", err)
			}
		}
		if err := MigrateTx(ctx, tx, d); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		return nil
	}
	return fmt.Errorf("%w: %T", ErrUnsupportedTx, db)
}
