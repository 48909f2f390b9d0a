package sqldedup

import (
	"context"
	"fmt"

	"github.com/idemq/idemq/dedup/migrate"
)

// Migrate creates the schema (PostgreSQL) and applies every migration not yet
// applied, in one transaction. Concurrent calls are serialised (an advisory
// lock on PostgreSQL, the write lock on SQLite), so every worker may call it
// at start-up. It is dedup/migrate's Migrator for the store's dialect, schema
// and table; use that package to apply the migrations in your own
// transaction, print their SQL or list the applied versions.
func (s *Store) Migrate(ctx context.Context) error {
	m, err := migrate.NewSQL(s.db, migrate.Config{Line: migrate.Dedup, Dialect: s.cfg.Dialect, Schema: s.cfg.Schema, Table: s.cfg.Table})
	if err != nil {
		return fmt.Errorf("sqldedup: %w", err)
	}
	if _, err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("sqldedup: %w", err)
	}
	return nil
}

// CheckSchema implements dedup.SchemaChecker: one statement that reads no
// row checks that the record table and its failure table exist with every
// column of the latest migration. It returns a *dedup.SchemaError (matching
// dedup.ErrNotMigrated) naming Migrate when they do not, and the database's
// error when it could not be asked. The Runner calls it when Run starts.
func (s *Store) CheckSchema(ctx context.Context) error { return s.shared.CheckSchema(ctx) }
