package pgdedup_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// CheckSchema tells a migrated table from a missing one, a missing failure
// table and a table without the latest migration's column.
func TestCheckSchema(t *testing.T) {
	ctx := testCtx(t)
	url := testenv.DatabaseURL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	schema := testenv.Schema(t, url)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema, Table: "records"})
	if err != nil {
		t.Fatal(err)
	}
	var _ dedup.SchemaChecker = store
	notMigrated := func(when string) {
		t.Helper()
		err := store.CheckSchema(ctx)
		var se *dedup.SchemaError
		if !errors.As(err, &se) || !errors.Is(err, dedup.ErrNotMigrated) || se.Table != schema+".records" {
			t.Errorf("%s: CheckSchema = %v; want a *dedup.SchemaError for %s.records", when, err, schema)
		}
	}
	notMigrated("before Migrate")
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.CheckSchema(ctx); err != nil {
		t.Fatalf("after Migrate: CheckSchema = %v", err)
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`ALTER TABLE ` + pgx.Identifier{schema, "records"}.Sanitize() + ` DROP COLUMN result`)
	notMigrated("without the result column")
	exec(`ALTER TABLE ` + pgx.Identifier{schema, "records"}.Sanitize() + ` ADD COLUMN result bytea`)
	exec(`DROP TABLE ` + pgx.Identifier{schema, "records_failures"}.Sanitize())
	notMigrated("without the failure table")

	pool.Close()
	if err := store.CheckSchema(ctx); err == nil || errors.Is(err, dedup.ErrNotMigrated) {
		t.Errorf("closed pool: CheckSchema = %v; want an error that is not ErrNotMigrated", err)
	}
}
