package pgdedup

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// Migration is one numbered schema change. The files (plain SQL with goose
// annotations, written for the default table name in the connection's
// search_path) are shared with dedup/sqldedup's PostgreSQL dialect; Migrate
// renders them for the configured schema and table, and MigrationSQL prints
// the result.
type Migration = sqlstore.Migration

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	ms, err := sqlstore.Postgres()
	if err != nil {
		return nil, fmt.Errorf("pgdedup: %w", err)
	}
	return ms, nil
}

// render rewrites migration SQL written for the default table name so that it
// applies to the configured schema and table. Names were validated in New.
func (s *Store) render(sql string) string {
	return sqlstore.Render(sql, s.q.table, s.cfg.Table, func(name string) string { return pgx.Identifier{name}.Sanitize() })
}

// MigrationSQL returns the SQL that Migrate would apply on an empty database,
// rendered for the configured schema and table, for review or for other
// migration tools.
func (s *Store) MigrationSQL() (string, error) {
	ms, err := Migrations()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n\n", pgx.Identifier{s.cfg.Schema}.Sanitize())
	for _, m := range ms {
		fmt.Fprintf(&b, "-- %s\n%s\n\n", m.Name, s.render(m.Up))
	}
	return b.String(), nil
}

// Migrate creates the schema and applies every migration not yet applied, in
// one transaction. Concurrent calls are serialised by an advisory lock, so
// every worker may call it at start-up.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.ApplyMigrations(ctx)
	return err
}

// ApplyMigrations is Migrate that also returns the migrations it applied, in
// version order: none when the table was already up to date. Of concurrent
// calls, only the first to take the lock applies and reports them.
func (s *Store) ApplyMigrations(ctx context.Context) ([]Migration, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: migrate: %w", err)
	}
	defer tx.Rollback(ctx) // safe after commit
	applied, err := s.migrateTx(ctx, tx)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("pgdedup: migrate: commit: %w", err)
	}
	return applied, nil
}

// MigrateTx is Migrate inside the caller's transaction, for applications that
// run their own migrations in one transaction.
func (s *Store) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	_, err := s.migrateTx(ctx, tx)
	return err
}

// migrateTx applies the pending migrations in tx and returns them.
func (s *Store) migrateTx(ctx context.Context, tx pgx.Tx) ([]Migration, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	versions := pgx.Identifier{s.cfg.Schema, s.cfg.Table + "_migrations"}.Sanitize()
	steps := []string{
		`SELECT pg_advisory_xact_lock(hashtext('idemq.pgdedup.migrate'))`,
		`CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{s.cfg.Schema}.Sanitize(),
		`CREATE TABLE IF NOT EXISTS ` + versions + ` (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`,
	}
	for _, sql := range steps {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return nil, fmt.Errorf("pgdedup: migrate: %w", err)
		}
	}
	rows, err := tx.Query(ctx, `SELECT version FROM `+versions)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: migrate: %w", err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("pgdedup: migrate: %w", err)
	}
	pending := sqlstore.Pending(ms, done)
	for _, m := range pending {
		if _, err := tx.Exec(ctx, s.render(m.Up)); err != nil {
			return nil, fmt.Errorf("pgdedup: migration %s: %w", m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+versions+` (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("pgdedup: migration %s: %w", m.Name, err)
		}
	}
	return pending, nil
}

// CheckSchema implements dedup.SchemaChecker: one statement that reads no
// row checks that the record table and its failure table exist with every
// column of the latest migration. It returns a *dedup.SchemaError (matching
// dedup.ErrNotMigrated) naming Migrate when they do not, and the database's
// error when it could not be asked. The Runner calls it when Run starts.
func (s *Store) CheckSchema(ctx context.Context) error {
	_, err := s.db.Exec(ctx, sqlstore.SchemaProbe(s.q.table, s.failuresTable()))
	switch {
	case sqlstore.Undefined(err):
		return &dedup.SchemaError{Table: s.cfg.Schema + "." + s.cfg.Table, Migrate: migrateHint, Err: err}
	case err != nil:
		return fmt.Errorf("pgdedup: check schema: %w", err)
	}
	return nil
}

// migrateHint is how a missing table is created, for dedup.SchemaError.
const migrateHint = "create it with pgdedup.Store.Migrate (or run `idemq migrate`, or apply MigrationSQL)"
