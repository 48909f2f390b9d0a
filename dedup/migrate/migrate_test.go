package migrate_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/internal/testenv"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// runner is a Migrator of either transaction type, as the tests use it.
type runner interface {
	Migrate(ctx context.Context) ([]migrate.Migration, error)
	ExistingVersions(ctx context.Context) ([]migrate.Migration, error)
	AllVersions() []migrate.Migration
	SQL() string
	Table() string
}

// target is a database to migrate and a way to ask it for a table.
type target struct {
	name string
	new  func(t *testing.T, cfg migrate.Config) (runner, *sql.DB)
}

func targets() []target {
	return []target{
		{"pgx", func(t *testing.T, cfg migrate.Config) (runner, *sql.DB) {
			pool, schema := testenv.SchemaPool(t)
			cfg.Schema = schema
			m, err := migrate.NewPgx(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open("pgx", testenv.DatabaseURL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return m, db
		}},
		{"database/sql postgres", func(t *testing.T, cfg migrate.Config) (runner, *sql.DB) {
			url := testenv.DatabaseURL(t)
			cfg.Schema = testenv.Schema(t, url)
			db, err := sql.Open("pgx", url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			cfg.Dialect = migrate.Postgres
			m, err := migrate.NewSQL(db, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return m, db
		}},
	}
}

// TestMigrator applies each line to PostgreSQL through pgx and
// database/sql (dedup/sqldedup's tests do SQLite, so that this package's
// tests need no SQLite driver): the first Migrate
// applies every migration and records it, the second applies none, and
// the tables answer a query over every column of the latest migration.
func TestMigrator(t *testing.T) {
	probes := map[migrate.Line]string{
		migrate.Dedup:  "SELECT scope, key, payload_hash, processed_at, expires_at, result FROM %s WHERE 1 = 0",
		migrate.Outbox: "SELECT seq, id, source_key, destination, partition_key, routing_key, headers, body, state FROM %s WHERE 1 = 0",
	}
	for _, tg := range targets() {
		for _, line := range []migrate.Line{migrate.Dedup, migrate.Outbox} {
			t.Run(tg.name+"/"+string(line), func(t *testing.T) {
				cfg := migrate.Config{Line: line}
				if line == migrate.Dedup {
					cfg.Table = "custom_records"
				}
				m, db := tg.new(t, cfg)
				ctx := testCtx(t)
				all := m.AllVersions()
				if len(all) < 2 {
					t.Fatalf("AllVersions = %d migrations; want the line's files", len(all))
				}
				if before, err := m.ExistingVersions(ctx); err != nil || len(before) != 0 {
					t.Fatalf("ExistingVersions before Migrate = %v, %v; want none", before, err)
				}
				got, err := m.Migrate(ctx)
				if err != nil || len(got) != len(all) {
					t.Fatalf("first Migrate = %d migrations, %v; want %d", len(got), err, len(all))
				}
				if again, err := m.Migrate(ctx); err != nil || len(again) != 0 {
					t.Fatalf("second Migrate = %v, %v; want none", again, err)
				}
				done, err := m.ExistingVersions(ctx)
				if err != nil || len(done) != len(all) {
					t.Fatalf("ExistingVersions = %d, %v; want %d", len(done), err, len(all))
				}
				for i := range all {
					if done[i].Version != all[i].Version || done[i].Name != all[i].Name {
						t.Fatalf("ExistingVersions[%d] = %d %s; want %d %s", i, done[i].Version, done[i].Name, all[i].Version, all[i].Name)
					}
				}
				table := `"` + strings.ReplaceAll(m.Table(), ".", `"."`) + `"`
				if _, err := db.ExecContext(ctx, strings.Replace(probes[line], "%s", table, 1)); err != nil {
					t.Fatalf("table %s after Migrate: %v", table, err)
				}
			})
		}
	}
}

// TestMigrateConcurrent: every worker may call Migrate at start-up; of
// concurrent calls, one applies the migrations and the others none.
func TestMigrateConcurrent(t *testing.T) {
	for _, tg := range targets() {
		for _, line := range []migrate.Line{migrate.Dedup, migrate.Outbox} {
			t.Run(tg.name+"/"+string(line), func(t *testing.T) {
				m, _ := tg.new(t, migrate.Config{Line: line})
				ctx := testCtx(t)
				const n = 4
				var wg sync.WaitGroup
				applied := make([]int, n)
				errs := make([]error, n)
				for i := range n {
					wg.Go(func() {
						ms, err := m.Migrate(ctx)
						applied[i], errs[i] = len(ms), err
					})
				}
				wg.Wait()
				total := 0
				for i := range n {
					if errs[i] != nil {
						t.Fatalf("Migrate %d: %v", i, errs[i])
					}
					total += applied[i]
				}
				if want := len(m.AllVersions()); total != want {
					t.Fatalf("concurrent Migrate applied %d migrations in all; want %d, once each", total, want)
				}
			})
		}
	}
}

// TestMigrateTxRollback: MigrateTx applies nothing until the caller's
// transaction commits.
func TestMigrateTxRollback(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testCtx(t)
	m, err := migrate.NewPgx(pool, migrate.Config{Line: migrate.Outbox, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.MigrateTx(ctx, tx); err != nil || len(got) == 0 {
		t.Fatalf("MigrateTx = %v, %v", got, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if done, err := m.ExistingVersions(ctx); err != nil || len(done) != 0 {
		t.Fatalf("ExistingVersions after a rolled-back MigrateTx = %v, %v; want none", done, err)
	}
}

// TestSQL: the printed SQL is rendered for the configured names.
func TestSQL(t *testing.T) {
	m, err := migrate.NewSQL(nil, migrate.Config{Schema: "billing", Table: "records"})
	if err != nil {
		t.Fatal(err)
	}
	s := m.SQL()
	for _, want := range []string{`CREATE SCHEMA IF NOT EXISTS "billing";`, `CREATE TABLE IF NOT EXISTS "billing"."records"`, `"billing"."records_failures"`} {
		if !strings.Contains(s, want) {
			t.Errorf("SQL has no %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "processed_messages (") || strings.Contains(s, "processed_messages\n") {
		t.Errorf("SQL names the default table:\n%s", s)
	}
	o, err := migrate.NewSQL(nil, migrate.Config{Line: migrate.Outbox, Schema: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if s := o.SQL(); !strings.Contains(s, `SET search_path TO "billing";`) || !strings.Contains(s, "pg_notify('idemq_outbox'") {
		t.Errorf("outbox SQL does not enter its schema or lost its channel:\n%s", s)
	}
	l, err := migrate.NewSQL(nil, migrate.Config{Dialect: migrate.SQLite, Table: "billing_msgs"})
	if err != nil {
		t.Fatal(err)
	}
	if s := l.SQL(); !strings.Contains(s, `CREATE TABLE IF NOT EXISTS "billing_msgs"`) ||
		!strings.Contains(s, `"billing_msgs_expires_at_idx"`) || strings.Contains(s, "processed_messages (") {
		t.Errorf("SQLite SQL not rendered for the configured table:\n%s", s)
	}
	if _, err := m.Migrate(context.Background()); err == nil {
		t.Error("Migrate without a database: no error")
	}
}

// TestConfigErrors: invalid names and combinations are configuration
// errors, before any connection.
func TestConfigErrors(t *testing.T) {
	for _, cfg := range []migrate.Config{
		{Line: "jobs"},
		{Dialect: "oracle"},
		{Schema: "a;b"},
		{Table: "x y"},
		{Line: migrate.Outbox, Table: "mine"},
		{Dialect: migrate.SQLite, Schema: "billing"},
	} {
		_, err := migrate.NewSQL(nil, cfg)
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("NewSQL(%+v) = %v; want an *idemq.ConfigError", cfg, err)
		}
	}
	if _, err := migrate.NewPgx(&pgxpool.Pool{}, migrate.Config{Dialect: migrate.SQLite}); err == nil {
		t.Error("NewPgx with SQLite: no error")
	}
}

// TestPartitionedKeepsHistory partitions a table with records (Prepare,
// then Migrate with Partitioned) and reverts it (the Down section): no
// record is lost either way, and the table works as each layout's claims
// need it.
func TestPartitionedKeepsHistory(t *testing.T) {
	ctx := testCtx(t)
	pool, schema := testenv.SchemaPool(t)
	plain, err := migrate.NewPgx(pool, migrate.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	table := `"` + schema + `".processed_messages`
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, key, payload_hash, processed_at, expires_at, result)
SELECT 's', 'k' || i, '\x00', now() - i * interval '1 day', now() + (7 - i) * interval '1 day', 'r'
FROM generate_series(0, 9) AS i`); err != nil {
		t.Fatal(err)
	}
	part, err := migrate.NewPgx(pool, migrate.Config{Schema: schema, Partitioned: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := part.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	applied, err := part.Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 2 || applied[0].Version != 4 || applied[1].Version != 5 {
		t.Fatalf("applied %+v, want versions 4 and 5", applied)
	}
	layout := func() (kind string, records, partitions int) {
		t.Helper()
		err := pool.QueryRow(ctx, `SELECT c.relkind::text, (SELECT count(*) FROM `+table+`),
(SELECT count(*) FROM pg_inherits WHERE inhparent = c.oid)
FROM pg_class AS c WHERE c.oid = $1::regclass`, table).Scan(&kind, &records, &partitions)
		if err != nil {
			t.Fatal(err)
		}
		return kind, records, partitions
	}
	if kind, records, partitions := layout(); kind != "p" || records != 10 || partitions != 2 {
		t.Fatalf("after 004: relkind %q, %d records, %d partitions; want p, 10, 2 (the table, the day after it)", kind, records, partitions)
	}
	// A record of the next partition's day is accepted: the bound that
	// Prepare checked is gone.
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, key, payload_hash, processed_at, expires_at)
VALUES ('s', 'later', '\x00', date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '2 days 1 hour', now() + interval '9 days')`); err != nil {
		t.Fatal(err)
	}
	// 005's index is the parent's, attached to 001's on the first
	// partition rather than built beside it.
	var brins, attached int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT FROM pg_inherits WHERE inhrelid = c.oid))
FROM pg_inherits AS p JOIN pg_index AS i ON i.indrelid = p.inhrelid JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE p.inhparent = $1::regclass AND c.relam = (SELECT oid FROM pg_am WHERE amname = 'brin')`, table).Scan(&brins, &attached); err != nil {
		t.Fatal(err)
	}
	if brins != 2 || attached != 2 {
		t.Fatalf("after 005: %d BRIN indexes on the partitions, %d of them the parent's; want 2, 2 (one each)", brins, attached)
	}
	for _, v := range []int{4, 3} {
		if _, err := pool.Exec(ctx, part.AllVersions()[v].Down); err != nil {
			t.Fatalf("%s's Down: %v", part.AllVersions()[v].Name, err)
		}
	}
	var expiry bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_indexes WHERE schemaname = $1 AND tablename = 'processed_messages' AND indexname = 'processed_messages_expires_at_idx')`, schema).Scan(&expiry); err != nil || !expiry {
		t.Fatalf("after the Downs, 001's expiry index: %v, %v; want it back", expiry, err)
	}
	if kind, records, partitions := layout(); kind != "r" || records != 11 || partitions != 0 {
		t.Fatalf("after the Downs: relkind %q, %d records, %d partitions; want r, 11, 0", kind, records, partitions)
	}
	// The unpartitioned claim's ON CONFLICT (scope, key) has its key back.
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, key, payload_hash, expires_at) VALUES ('s', 'k1', '\x00', now())
ON CONFLICT (scope, key) DO NOTHING`); err != nil {
		t.Fatal(err)
	}
}
