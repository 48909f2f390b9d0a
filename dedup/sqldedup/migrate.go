package sqldedup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
	"github.com/idemq/idemq/dedup/migrate"
)

// Migrate creates the schema (PostgreSQL) and applies every migration not yet
// applied, in one transaction. Concurrent calls are serialised (an advisory
// lock on PostgreSQL, the write lock on SQLite), so every worker may call it
// at start-up. It is dedup/migrate's Migrator for the store's dialect, schema
// and table; use that package to apply the migrations in your own
// transaction, print their SQL or list the applied versions.
func (s *Store) Migrate(ctx context.Context) error {
	m, err := migrate.NewSQL(s.db, s.migrateConfig())
	if err != nil {
		return fmt.Errorf("sqldedup: %w", err)
	}
	if _, err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("sqldedup: %w", err)
	}
	return nil
}

// migrateConfig is the dedup/migrate Config of the store's table.
func (s *Store) migrateConfig() migrate.Config {
	c := migrate.Config{Line: migrate.Dedup, Dialect: s.cfg.Dialect, Table: s.cfg.Table}
	if s.cfg.Dialect == Postgres {
		c.Schema = s.cfg.Schema
	}
	return c
}

// CheckSchema implements dedup.SchemaChecker: one statement that reads no
// row checks that the record table and its failure table exist with every
// column of the latest migration. It returns a *dedup.SchemaError (matching
// dedup.ErrNotMigrated) naming Migrate when they do not, and the database's
// error when it could not be asked. The Runner calls it when Run starts.
func (s *Store) CheckSchema(ctx context.Context) error {
	var one int
	err := s.db.QueryRowContext(ctx, sqlstore.SchemaProbe(s.q.table, s.failuresTable())).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case sqlstore.Undefined(err):
		table := s.cfg.Table
		if s.cfg.Dialect == Postgres {
			table = s.cfg.Schema + "." + table
		}
		return &dedup.SchemaError{Table: table, Migrate: "create it with sqldedup.Store.Migrate (or run `idemq migrate`, or dedup/migrate)", Err: err}
	case err != nil:
		return fmt.Errorf("sqldedup: check schema: %w", err)
	}
	return nil
}
