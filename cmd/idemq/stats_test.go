package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/internal/testenv"
)

// statsRows are the records the stats tests insert: ages and expiries
// relative to now.
var statsRows = []struct {
	scope, key string
	age        time.Duration
	expiresIn  time.Duration
}{
	{"billing", "a", 10 * time.Second, time.Hour},
	{"billing", "b", 10 * time.Minute, time.Hour},
	{"billing", "c", 3 * time.Hour, -time.Minute}, // expired, not deleted
	{"billing", "d", 10 * 24 * time.Hour, -time.Hour},
	{"email", "e", 2 * 24 * time.Hour, time.Hour},
}

func checkStats(t *testing.T, out string) {
	t.Helper()
	var st tableStats
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("stats --json output %q: %v", out, err)
	}
	if st.Total != 5 || len(st.Scopes) != 2 {
		t.Fatalf("stats %+v, want 5 records in 2 scopes", st)
	}
	b, e := st.Scopes[0], st.Scopes[1]
	if b.Scope != "billing" || b.Records != 4 || b.Expired != 2 || e.Scope != "email" || e.Records != 1 || e.Expired != 0 {
		t.Errorf("scopes %+v", st.Scopes)
	}
	want := map[string]int64{"<1m": 1, "<1h": 1, "<1d": 1, "<7d": 0, ">=7d": 1}
	for k, v := range want {
		if b.Ages[k] != v {
			t.Errorf("billing ages %v, want %v", b.Ages, want)
			break
		}
	}
	if e.Ages["<7d"] != 1 {
		t.Errorf("email ages %v", e.Ages)
	}
	if age := time.Since(b.Oldest); age < 9*24*time.Hour || age > 11*24*time.Hour {
		t.Errorf("oldest %v", b.Oldest)
	}
	if age := time.Since(b.Newest); age > time.Minute {
		t.Errorf("newest %v", b.Newest)
	}
}

func TestStatsSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idemq.db")
	if code, _, errOut := idemq(t, "migrate", "--dsn", "sqlite:"+path); code != exitOK {
		t.Fatalf("migrate: %s", errOut)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now()
	for _, r := range statsRows {
		if _, err := db.Exec(`INSERT INTO processed_messages (scope, key, payload_hash, processed_at, expires_at) VALUES (?, ?, x'00', ?, ?)`,
			r.scope, r.key, now.Add(-r.age).UnixMicro(), now.Add(r.expiresIn).UnixMicro()); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := idemq(t, "stats", "--dsn", "sqlite:"+path, "--json")
	if code != exitOK {
		t.Fatalf("stats = %d: %s", code, errOut)
	}
	checkStats(t, out)
	code, out, _ = idemq(t, "stats", "--dsn", "sqlite:"+path)
	if code != exitOK || !strings.Contains(out, "billing") || !strings.Contains(out, "5 records in 2 scopes") {
		t.Errorf("stats table:\n%s", out)
	}
}

func TestStatsPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped with -short")
	}
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	if code, _, errOut := idemq(t, "migrate", "--dsn", url, "--schema", schema); code != exitOK {
		t.Fatalf("migrate: %s", errOut)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	table := pgx.Identifier{schema, "processed_messages"}.Sanitize()
	now := time.Now()
	for _, r := range statsRows {
		if _, err := db.ExecContext(context.Background(), `INSERT INTO `+table+` (scope, key, payload_hash, processed_at, expires_at) VALUES ($1, $2, '\x00', $3, $4)`,
			r.scope, r.key, now.Add(-r.age), now.Add(r.expiresIn)); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := idemq(t, "stats", "--dsn", url, "--schema", schema, "--json")
	if code != exitOK {
		t.Fatalf("stats = %d: %s", code, errOut)
	}
	checkStats(t, out)
	var st tableStats
	_ = json.Unmarshal([]byte(out), &st)
	if st.TableBytes == nil || *st.TableBytes <= 0 || st.IndexBytes == nil || *st.IndexBytes <= 0 {
		t.Errorf("sizes: table %v, indexes %v", st.TableBytes, st.IndexBytes)
	}
	code, out, _ = idemq(t, "stats", "--dsn", url, "--schema", schema)
	if code != exitOK || !strings.Contains(out, "indexes") {
		t.Errorf("stats table:\n%s", out)
	}
}

// outboxRows are the outbox rows the stats tests insert: state and age.
var outboxRows = []struct {
	state int
	age   time.Duration
}{
	{0, time.Hour}, {0, time.Minute}, // pending
	{1, 3 * time.Hour}, // sent
	{2, 2 * time.Hour}, // parked
}

// checkOutboxStats checks the outbox part of `idemq stats` for outboxRows,
// in JSON and in the table.
func checkOutboxStats(t *testing.T, args ...string) {
	t.Helper()
	code, out, errOut := idemq(t, append([]string{"stats", "--json"}, args...)...)
	if code != exitOK {
		t.Fatalf("stats = %d: %s", code, errOut)
	}
	var st tableStats
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("stats --json output %q: %v", out, err)
	}
	o := st.Outbox
	if o == nil || o.Pending != 2 || o.Sent != 1 || o.Parked != 1 || o.OldestPending == nil || o.OldestParked == nil {
		t.Fatalf("outbox stats %+v in\n%s", o, out)
	}
	if age := time.Since(*o.OldestPending); age < 59*time.Minute || age > 61*time.Minute {
		t.Errorf("oldest pending row %v old, want an hour", age)
	}
	if age := time.Since(*o.OldestParked); age < 119*time.Minute || age > 121*time.Minute {
		t.Errorf("oldest parked row %v old, want two hours", age)
	}
	code, out, _ = idemq(t, append([]string{"stats"}, args...)...)
	if code != exitOK || !strings.Contains(out, "idemq_outbox") || !strings.Contains(out, "2 pending (oldest 1h0m") ||
		!strings.Contains(out, "1 parked (oldest 2h0m") || !strings.Contains(out, "1 sent") {
		t.Errorf("stats table:\n%s", out)
	}
}

// idemq stats counts the outbox's pending, parked and sent rows when the
// outbox table exists, and leaves the outbox out when it does not.
func TestStatsOutboxSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idemq.db")
	if code, _, errOut := idemq(t, "migrate", "--dsn", "sqlite:"+path); code != exitOK {
		t.Fatalf("migrate: %s", errOut)
	}
	code, out, _ := idemq(t, "stats", "--dsn", "sqlite:"+path, "--json")
	if code != exitOK || strings.Contains(out, `"outbox"`) {
		t.Fatalf("stats without an outbox table = %d:\n%s", code, out)
	}
	if code, _, errOut := idemq(t, "migrate", "--outbox", "--dsn", "sqlite:"+path); code != exitOK {
		t.Fatalf("migrate --outbox: %s", errOut)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now()
	for i, r := range outboxRows {
		if _, err := db.Exec(`INSERT INTO idemq_outbox (id, destination, body, state, created_at) VALUES (?, 'd', x'00', ?, ?)`,
			"e"+strconv.Itoa(i), r.state, now.Add(-r.age).UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	checkOutboxStats(t, "--dsn", "sqlite:"+path)
}

func TestStatsOutboxPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped with -short")
	}
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	if code, _, errOut := idemq(t, "migrate", "--dsn", url, "--schema", schema); code != exitOK {
		t.Fatalf("migrate: %s", errOut)
	}
	code, out, _ := idemq(t, "stats", "--dsn", url, "--schema", schema, "--json")
	if code != exitOK || strings.Contains(out, `"outbox"`) {
		t.Fatalf("stats without an outbox table = %d:\n%s", code, out)
	}
	inSchema, err := testenv.WithSearchPath(url, schema)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", inSchema)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m, err := migrate.NewSQL(db, migrate.Config{Line: migrate.Outbox})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, r := range outboxRows {
		if _, err := db.ExecContext(ctx, `INSERT INTO idemq_outbox (id, destination, body, state, created_at) VALUES ($1, 'd', '\x00', $2, $3)`,
			"e"+strconv.Itoa(i), r.state, now.Add(-r.age)); err != nil {
			t.Fatal(err)
		}
	}
	checkOutboxStats(t, "--dsn", url, "--schema", schema)
}
