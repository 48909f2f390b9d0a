package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/testenv"
)

// The demo's supervisor starts workers as "<this program> demo worker ...":
// the test binary answers that itself.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "demo" && os.Args[2] == "worker" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func idemq(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestHelpAndUsageErrors(t *testing.T) {
	if code, out, _ := idemq(t, "help"); code != exitOK || !strings.Contains(out, "migrate") || strings.Contains(out, "demo-worker") {
		t.Fatalf("help = %d:\n%s", code, out)
	}
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"migrate"},                       // no DSN
		{"migrate", "--dsn", "mysql://x"}, // unknown database
		{"inspect", "--dsn", "x.db", "k"}, // no scope
		{"inspect", "--dsn", "x.db", "--scope", "s"}, // no key
		{"demo", "--broker", "pulsar"},
		{"demo", "--no-such-flag"},
	} {
		if code, _, errOut := idemq(t, args...); code != exitUsage {
			t.Errorf("idemq %q = %d, want %d (usage); stderr:\n%s", args, code, exitUsage, errOut)
		}
	}
}

func TestMigratePrint(t *testing.T) {
	code, out, errOut := idemq(t, "migrate", "--dsn", "postgres://nowhere.invalid/db", "--schema", "billing", "--print")
	if code != exitOK || !strings.Contains(out, `CREATE TABLE IF NOT EXISTS "billing"."processed_messages"`) {
		t.Fatalf("migrate --print (postgres) = %d:\n%s%s", code, out, errOut)
	}
	code, out, errOut = idemq(t, "migrate", "--dsn", "sqlite:never-created.db", "--table", "seen", "--print")
	if code != exitOK || !strings.Contains(out, `CREATE TABLE IF NOT EXISTS "seen"`) || !strings.Contains(out, "WITHOUT ROWID") {
		t.Fatalf("migrate --print (sqlite) = %d:\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat("never-created.db"); err == nil {
		t.Fatal("migrate --print created the database file")
	}
}

// record marks key as processed in the store behind dsn, as a runner would.
func record(t *testing.T, db *sql.DB, cfg sqldedup.Config, scope, key, body string) {
	t.Helper()
	ctx := context.Background()
	store, err := sqldedup.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := store.MarkProcessedTx(ctx, tx, scope, key, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// inspectJSON is the output of `idemq inspect --json`.
type inspectJSON struct {
	Scope            string    `json:"scope"`
	Key              string    `json:"key"`
	State            string    `json:"state"`
	ProcessedAt      time.Time `json:"processed_at"`
	PayloadHash      string    `json:"payload_hash"`
	ExpiresAt        time.Time `json:"expires_at"`
	ExpiresInSeconds float64   `json:"expires_in_seconds"`
}

// migrateInspectPurge runs the record's life through the command line.
func migrateInspectPurge(t *testing.T, dsn string, extra []string, open func() (*sql.DB, sqldedup.Config)) {
	t.Helper()
	if code, out, errOut := idemq(t, append([]string{"migrate", "--dsn", dsn}, extra...)...); code != exitOK || !strings.Contains(out, "up to date") {
		t.Fatalf("migrate = %d:\n%s%s", code, out, errOut)
	}
	if code, _, errOut := idemq(t, append([]string{"migrate", "--dsn", dsn}, extra...)...); code != exitOK {
		t.Fatalf("second migrate = %d:\n%s", code, errOut)
	}
	db, cfg := open()
	record(t, db, cfg, "checkout", "order-42", `{"id":"order-42"}`)
	db.Close()

	code, out, errOut := idemq(t, append(append([]string{"inspect", "--dsn", dsn}, extra...), "--scope", "checkout", "order-42")...)
	hash := "sha256:" + hexSHA256(`{"id":"order-42"}`)
	if code != exitOK || !strings.Contains(out, "key           order-42") || !strings.Contains(out, hash) ||
		!strings.Contains(out, "state         processed") || !strings.Contains(out, "expires at") {
		t.Fatalf("inspect = %d:\n%s%s", code, out, errOut)
	}
	code, out, errOut = idemq(t, append(append([]string{"inspect", "--dsn", dsn, "--json"}, extra...), "--scope", "checkout", "order-42")...)
	var rec inspectJSON
	if code != exitOK {
		t.Fatalf("inspect --json = %d:\n%s%s", code, out, errOut)
	}
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("inspect --json output %q: %v", out, err)
	}
	if rec.Scope != "checkout" || rec.Key != "order-42" || rec.State != "processed" || rec.PayloadHash != hash ||
		rec.ProcessedAt.IsZero() || !rec.ExpiresAt.After(rec.ProcessedAt) || rec.ExpiresInSeconds <= 0 {
		t.Fatalf("inspect --json = %+v", rec)
	}
	if code, _, errOut := idemq(t, append(append([]string{"inspect", "--dsn", dsn}, extra...), "--scope", "other", "order-42")...); code != exitFailure || !strings.Contains(errOut, "no record") {
		t.Fatalf("inspect in another scope = %d:\n%s", code, errOut)
	}
	if code, out, errOut := idemq(t, append(append([]string{"purge", "--dsn", dsn}, extra...), "--scope", "checkout", "order-42")...); code != exitOK {
		t.Fatalf("purge = %d:\n%s%s", code, out, errOut)
	}
	if code, _, _ := idemq(t, append(append([]string{"inspect", "--dsn", dsn}, extra...), "--scope", "checkout", "order-42")...); code != exitFailure {
		t.Fatalf("inspect after purge = %d, want %d", code, exitFailure)
	}
}

func TestMigrateInspectPurgeSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shop.db")
	migrateInspectPurge(t, "sqlite:"+path, nil, func() (*sql.DB, sqldedup.Config) {
		db, err := sqldedup.OpenSQLite(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		return db, sqldedup.Config{Dialect: sqldedup.SQLite}
	})
}

func TestMigrateInspectPurgePostgres(t *testing.T) {
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	migrateInspectPurge(t, url, []string{"--schema", schema}, func() (*sql.DB, sqldedup.Config) {
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		return db, sqldedup.Config{Dialect: sqldedup.Postgres, Schema: schema}
	})
}

// TestDemoCommand runs `idemq demo` shortened, with this test binary as the
// worker program, and checks that it prints the summary and the proof.
func TestDemoCommand(t *testing.T) {
	start := time.Now()
	code, out, errOut := idemq(t, "demo", "--messages", "300", "--kills", "2", "--seed", "11")
	t.Logf("idemq demo took %s:\n%s%s", time.Since(start).Round(time.Millisecond), out, errOut)
	if code != exitOK {
		t.Fatalf("idemq demo = %d, want 0", code)
	}
	for _, want := range []string{"KILL -9 worker #1", "Summary", "messages sent", "duplicates absorbed", "worker restarts", "PROOF HOLDS"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}

func hexSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
