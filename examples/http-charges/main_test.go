package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/sqldedup"
)

// startServer runs the example's server in the test's process on a SQLite
// file and returns its base URL and the file.
func startServer(t *testing.T) (base, dbPath string) {
	t.Helper()
	dbPath = filepath.Join(t.TempDir(), "charges.db")
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, addr, "sqlite:"+dbPath, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	base = "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/accounts/1")
		if err == nil {
			resp.Body.Close()
			return base, dbPath
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("serve returned: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not answer: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// send sends a request with the token as a bearer credential (none when
// empty) and key as the Idempotency-Key (none when empty).
func send(t *testing.T, method, url, token, key, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// TestCallers: keys are the authenticated caller's own. Two callers who
// send the same key are two charges, neither sees the other's answer, and
// a request without credentials is refused.
func TestCallers(t *testing.T) {
	base, _ := startServer(t)
	body := `{"account": 7, "amount": 500}`
	st, _, alice := send(t, http.MethodPost, base+"/charges", "alice-token", "k1", body)
	if st != http.StatusCreated {
		t.Fatalf("alice: %d %s, want 201", st, alice)
	}
	st, hdr, bob := send(t, http.MethodPost, base+"/charges", "bob-token", "k1", body)
	if st != http.StatusCreated || hdr.Get("Idempotent-Replayed") != "" || bob == alice {
		t.Fatalf("bob, alice's key: %d %v %s, want a charge of his own (alice got %s)", st, hdr, bob, alice)
	}
	if st, _, b := send(t, http.MethodPost, base+"/charges", "bob-token", "k2", `{"account": 7, "amount": 1}`); st != http.StatusCreated {
		t.Fatalf("bob, a key of his: %d %s, want 201", st, b)
	}
	st, hdr, again := send(t, http.MethodPost, base+"/charges", "alice-token", "k1", body)
	if st != http.StatusCreated || hdr.Get("Idempotent-Replayed") != "true" || again != alice {
		t.Fatalf("alice's retry: %d %v %s, want the replay of %s", st, hdr, again, alice)
	}
	for _, token := range []string{"", "mallory-token"} {
		if st, _, b := send(t, http.MethodPost, base+"/charges", token, "k1", body); st != http.StatusUnauthorized {
			t.Fatalf("token %q: %d %s, want 401", token, st, b)
		}
	}
}

// TestErrorDetails: what a client is told of a failure names the client's
// mistake, never a Go type or a database's error text.
func TestErrorDetails(t *testing.T) {
	base, dbPath := startServer(t)
	for _, body := range []string{`{"account": "seven", "amount": 500}`, `{"account": 7, "amount": 5, "note": 1}`, `{"account": 7,`} {
		st, _, b := send(t, http.MethodPost, base+"/charges", "alice-token", "bad-"+body, body)
		var p struct{ Detail string }
		if st != http.StatusBadRequest || json.Unmarshal([]byte(b), &p) != nil || p.Detail == "" {
			t.Fatalf("body %s: %d %s, want 400 with a problem detail", body, st, b)
		}
		for _, internal := range []string{"Go ", "int64", "main.", "json:"} {
			if strings.Contains(p.Detail, internal) {
				t.Fatalf("body %s: detail %q tells %q", body, p.Detail, internal)
			}
		}
	}

	// The database fails: the client gets a 500 that says nothing of it.
	db, err := sqldedup.OpenSQLite(context.Background(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`DROP TABLE accounts`); err != nil {
		t.Fatal(err)
	}
	st, _, b := send(t, http.MethodGet, base+"/accounts/7", "alice-token", "", "")
	if st != http.StatusInternalServerError || strings.Contains(b, "accounts") || strings.Contains(b, "SQL") {
		t.Fatalf("GET with the table gone: %d %q, want a 500 that names no database object", st, b)
	}
	st, _, b = send(t, http.MethodPost, base+"/charges", "alice-token", "k-gone", `{"account": 7, "amount": 5}`)
	if st != http.StatusInternalServerError || strings.Contains(b, "accounts") || strings.Contains(b, "SQL") {
		t.Fatalf("POST with the table gone: %d %q, want a 500 that names no database object", st, b)
	}
}
