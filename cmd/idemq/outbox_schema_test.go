package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/testenv"
)

// idemq migrate --outbox --schema creates the outbox table in that schema
// (not in the search path's), and idemq relay --schema reads it there.
func TestOutboxSchemaFlags(t *testing.T) {
	ctx := context.Background()
	dbURL := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, dbURL)
	table := pgx.Identifier{schema, "idemq_outbox"}.Sanitize()

	code, out, errOut := idemq(t, "migrate", "--outbox", "--dsn", dbURL, "--schema", schema, "--print")
	if code != exitOK || !strings.Contains(out, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()) {
		t.Fatalf("migrate --outbox --schema --print = %d, want a script that enters the schema:\n%s%s", code, out, errOut)
	}
	code, out, errOut = idemq(t, "migrate", "--outbox", "--dsn", dbURL, "--schema", schema)
	if code != exitOK || !strings.Contains(out, "applied migration 1 (001_create_outbox.sql) to "+schema+".idemq_outbox") {
		t.Fatalf("migrate --outbox --schema = %d, want the migrations it applied:\n%s%s", code, out, errOut)
	}
	// The search path's default schema is another: the same command with the
	// schema in the URL's search_path finds everything there already.
	u, err := testenv.WithSearchPath(dbURL, schema)
	if err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := idemq(t, "migrate", "--outbox", "--dsn", u); code != exitOK || !strings.Contains(out, "already up to date") {
		t.Fatalf("migrate --outbox with search_path=%s = %d, want up to date:\n%s%s", schema, code, out, errOut)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var where *string
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, table).Scan(&where); err != nil {
		t.Fatal(err)
	}
	if where == nil {
		t.Fatalf("migrate --outbox --schema %s: no table %s; output:\n%s", schema, table, out)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (id, destination, body) VALUES ('o-1', 'q', '\x00')`); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	code, out, errOut = idemq(t, "relay", "--dsn", dbURL, "--schema", schema, "--stats")
	if code != exitOK || !strings.Contains(out, "pending         1") {
		t.Fatalf("relay --schema --stats = %d, want 1 pending:\n%s%s", code, out, errOut)
	}
	if code, _, errOut := idemq(t, "migrate", "--outbox", "--dsn", "sqlite:x.db", "--schema", schema, "--print"); code != exitUsage {
		t.Fatalf("migrate --outbox --schema on SQLite = %d, want %d:\n%s", code, exitUsage, errOut)
	}
}
