package pgdedup_test

import (
	"errors"
	"strings"
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

// TestCheckSchemaPartitionedTable: a store that is not Partitioned refuses,
// at start, a table that was partitioned (its claims' ON CONFLICT (scope,
// key) would fail on every message), naming the setting; a Partitioned one
// accepts both layouts.
func TestCheckSchemaPartitionedTable(t *testing.T) {
	ctx := testCtx(t)
	part, pool := newStore(t, pgdedup.Config{Partitioned: true})
	if err := part.CheckSchema(ctx); err != nil {
		t.Fatalf("Partitioned store on a partitioned table: CheckSchema = %v", err)
	}
	plain, err := pgdedup.New(pool, pgdedup.Config{Schema: part.Config().Schema})
	if err != nil {
		t.Fatal(err)
	}
	err = plain.CheckSchema(ctx)
	if !errors.Is(err, dedup.ErrNotMigrated) || !strings.Contains(err.Error(), "Config.Partitioned") {
		t.Fatalf("unpartitioned store on a partitioned table: CheckSchema = %v; want dedup.ErrNotMigrated naming Config.Partitioned", err)
	}
}
