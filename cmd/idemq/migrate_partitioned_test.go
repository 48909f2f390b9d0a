package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/testenv"
)

// TestMigratePartitioned: `idemq migrate --partitioned` partitions a table
// that holds records, keeps them, and says how long it held the lock;
// SQLite has no partitions.
func TestMigratePartitioned(t *testing.T) {
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	if code, out, errOut := idemq(t, "migrate", "--dsn", url, "--schema", schema); code != exitOK {
		t.Fatalf("migrate = %d:\n%s%s", code, out, errOut)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	table := `"` + schema + `".processed_messages`
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, key, payload_hash, expires_at)
SELECT 's', 'k' || i, '\x00', now() + interval '1 day' FROM generate_series(1, 100) AS i`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := idemq(t, "migrate", "--dsn", url, "--schema", schema, "--partitioned")
	if code != exitOK || !strings.Contains(out, "applied migration 4 ") || !strings.Contains(out, "held") {
		t.Fatalf("migrate --partitioned = %d, want migration 4 applied and the lock's time:\n%s%s", code, out, errOut)
	}
	var kind string
	var records int
	if err := pool.QueryRow(ctx, `SELECT relkind::text, (SELECT count(*) FROM `+table+`) FROM pg_class WHERE oid = $1::regclass`, table).Scan(&kind, &records); err != nil {
		t.Fatal(err)
	}
	if kind != "p" || records != 100 {
		t.Fatalf("after migrate --partitioned: relkind %q, %d records; want p, 100", kind, records)
	}
	if code, _, errOut := idemq(t, "migrate", "--dsn", "sqlite:"+t.TempDir()+"/x.db", "--partitioned"); code != exitUsage || !strings.Contains(errOut, "Partitioned") {
		t.Fatalf("migrate --partitioned on SQLite = %d, want a usage error naming Partitioned:\n%s", code, errOut)
	}
}
