package main

import (
	"database/sql"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stats --json names the table without SQL quotes and gives real sizes on
// SQLite (never -1); the text output counts "1 scope", not "1 scopes".
func TestStatsOutputShape(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idemq.db")
	if code, _, errOut := idemq(t, "migrate", "--dsn", "sqlite:"+path); code != exitOK {
		t.Fatalf("migrate: %s", errOut)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := db.Exec(`INSERT INTO processed_messages (scope, key, payload_hash, processed_at, expires_at) VALUES ('billing', 'k', x'00', ?, ?)`,
		now.UnixMicro(), now.Add(time.Hour).UnixMicro()); err != nil {
		db.Close()
		t.Fatal(err)
	}
	db.Close()
	code, out, errOut := idemq(t, "stats", "--dsn", "sqlite:"+path, "--json")
	if code != exitOK {
		t.Fatalf("stats --json = %d: %s", code, errOut)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, out)
	}
	if got["table"] != "processed_messages" {
		t.Errorf(`"table": %q, want "processed_messages" (no SQL quotes)`, got["table"])
	}
	for _, k := range []string{"table_bytes", "index_bytes"} {
		if n, ok := got[k].(float64); got[k] != nil && (!ok || n <= 0) {
			t.Errorf("%q: %v, want a size in bytes or null", k, got[k])
		}
	}
	code, out, errOut = idemq(t, "stats", "--dsn", "sqlite:"+path)
	if code != exitOK {
		t.Fatalf("stats = %d: %s", code, errOut)
	}
	if !strings.Contains(out, "1 record in 1 scope") || strings.Contains(out, "scopes") {
		t.Errorf("stats text, want \"1 record in 1 scope\":\n%s", out)
	}
}
