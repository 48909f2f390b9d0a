package sqldedup_test

import (
	"errors"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/sqldedup"
)

// CheckSchema tells a migrated table from a missing one, on SQLite and
// PostgreSQL.
func TestCheckSchema(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			migratedStore, db := open(t, sqldedup.Config{})
			var _ dedup.SchemaChecker = migratedStore
			if err := migratedStore.CheckSchema(ctx); err != nil {
				t.Fatalf("migrated: CheckSchema = %v", err)
			}
			cfg := migratedStore.Config()
			cfg.Table = "other"
			store, err := sqldedup.New(db, cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = store.CheckSchema(ctx)
			var se *dedup.SchemaError
			if !errors.As(err, &se) || !errors.Is(err, dedup.ErrNotMigrated) {
				t.Fatalf("not migrated: CheckSchema = %v; want a *dedup.SchemaError", err)
			}
			want := "other"
			if cfg.Dialect == sqldedup.Postgres {
				want = cfg.Schema + ".other"
			}
			if se.Table != want {
				t.Errorf("SchemaError.Table = %q, want %q", se.Table, want)
			}
		})
	}
}
