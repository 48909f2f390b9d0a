package pgdedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/migrate"
)

// Migrate creates the schema and applies every migration not yet applied, in
// one transaction. Concurrent calls are serialised by an advisory lock, so
// every worker may call it at start-up. It is dedup/migrate's Migrator for
// the store's schema and table; use that package to apply the migrations in
// your own transaction, print their SQL or list the applied versions.
func (s *Store) Migrate(ctx context.Context) error {
	m, err := migrate.NewPgx(s.db, migrate.Config{Line: migrate.Dedup, Schema: s.cfg.Schema, Table: s.cfg.Table, Partitioned: s.cfg.Partitioned})
	if err != nil {
		return fmt.Errorf("pgdedup: %w", err)
	}
	if _, err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("pgdedup: %w", err)
	}
	return nil
}

// CheckSchema implements dedup.SchemaChecker: one statement that reads no
// row checks that the record table and its failure table exist with every
// column of the latest migration, and, unless Config.Partitioned, a second
// that the table is not partitioned. It returns a *dedup.SchemaError (matching
// dedup.ErrNotMigrated) naming Migrate when they do not, and the database's
// error when it could not be asked. The Runner calls it when Run starts.
func (s *Store) CheckSchema(ctx context.Context) error {
	if err := s.shared.CheckSchema(ctx); err != nil || s.cfg.Partitioned {
		return err
	}
	// The claim of an unpartitioned table needs its key (scope, key).
	switch p, err := s.parts().Partitioned(ctx, s.db); {
	case err != nil:
		return fmt.Errorf("pgdedup: check schema: %w", err)
	case p:
		return &dedup.SchemaError{Table: s.cfg.Schema + "." + s.cfg.Table, Err: errPartitioned,
			Migrate: "set pgdedup.Config.Partitioned, or revert migration 004 (its Down section)"}
	}
	return nil
}

// errPartitioned is the cause CheckSchema gives when a store that is not
// Config.Partitioned finds a partitioned table.
var errPartitioned = errors.New("the table is partitioned by day")
