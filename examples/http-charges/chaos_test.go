package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/runtest"
)

// Environment of TestHelperServerChild.
const (
	envAddr = "HTTP_CHARGES_ADDR"
	envDSN  = "HTTP_CHARGES_DSN"
)

// TestHelperServerChild is the server that TestChaosKillRestart SIGKILLs:
// it runs only as a child process, with envAddr and envDSN set.
func TestHelperServerChild(t *testing.T) {
	addr, dsn := os.Getenv(envAddr), os.Getenv(envDSN)
	if addr == "" || dsn == "" {
		t.Skip("a child process of TestChaosKillRestart")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := serve(context.Background(), addr, dsn, log); err != nil {
		t.Fatal(err)
	}
}

// TestChaosKillRestart: concurrent clients charge distinct keys, each
// retrying on connection errors, 409 and 503 with the same key, then
// retrying once more after their answer and once with a different payload,
// while the server is SIGKILLed and restarted twice mid-run. Every key is
// charged exactly once, every replay is the first answer byte for byte,
// every mismatch is 422, and the balance is the sum of the charges.
func TestChaosKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and SIGKILLs server processes")
	}
	const (
		clients       = 8
		keysPerClient = 25
		keys          = clients * keysPerClient
	)
	dbPath := filepath.Join(t.TempDir(), "charges.db")
	addr := freeAddr(t)
	base := "http://" + addr
	env := []string{envAddr + "=" + addr, envDSN + "=sqlite:" + dbPath}

	var (
		mu    sync.Mutex
		child = runtest.StartChild(t, "TestHelperServerChild", env)
	)
	waitUp(t, base, child)

	var (
		answered atomic.Int64
		failed   atomic.Bool
		results  = make([]Charge, keys)
		amounts  = make([]int64, keys)
	)
	fail := func(format string, args ...any) {
		failed.Store(true)
		t.Errorf(format, args...)
	}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range keysPerClient {
				if failed.Load() {
					return
				}
				n := c*keysPerClient + i
				key := fmt.Sprintf("chaos-%d", n)
				amounts[n] = int64(1 + n%9)
				body := fmt.Sprintf(`{"account": %d, "amount": %d}`, 1+n%3, amounts[n])
				first, ok := until201(t, base, key, body)
				if !ok {
					fail("key %s: no 201 within the deadline", key)
					return
				}
				answered.Add(1)
				if err := json.Unmarshal([]byte(first.body), &results[n]); err != nil || results[n].ID == 0 {
					fail("key %s: answer %q is not a charge (%v)", key, first.body, err)
					return
				}
				again, ok := until201(t, base, key, body)
				if !ok || again.replayed != "true" || again.body != first.body || again.location != first.location {
					fail("key %s: retry %+v, want the replay of %+v", key, again, first)
					return
				}
				if n%5 == 0 {
					mismatch := fmt.Sprintf(`{"account": %d, "amount": %d}`, 1+n%3, amounts[n]+1)
					if r := untilAnswer(t, base, key, mismatch); r.status != http.StatusUnprocessableEntity {
						fail("key %s, different payload: %d %q, want 422", key, r.status, r.body)
					}
				}
			}
		}()
	}

	// Two SIGKILLs mid-run, each followed by a restart on the same port
	// and database.
	for _, at := range []int64{keys / 3, 2 * keys / 3} {
		runtest.WaitFor(t, 120*time.Second, func() string { return fmt.Sprintf("%d of %d keys answered", answered.Load(), keys) },
			func() bool { return answered.Load() >= at || failed.Load() })
		mu.Lock()
		child.Kill()
		child = runtest.StartChild(t, "TestHelperServerChild", env)
		mu.Unlock()
		t.Logf("SIGKILLed and restarted the server after %d answered keys", answered.Load())
	}
	wg.Wait()
	if failed.Load() {
		return
	}

	// Every key charged once, to the cent.
	db, err := sqldedup.OpenSQLite(context.Background(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var count, sum, balance int64
	if err := db.QueryRow(`SELECT count(*), coalesce(sum(amount), 0) FROM charges`).Scan(&count, &sum); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT coalesce(sum(balance), 0) FROM accounts`).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	var want int64
	ids := map[int64]bool{}
	for n, r := range results {
		want += amounts[n]
		if ids[r.ID] {
			t.Errorf("charge %d answered for two keys", r.ID)
		}
		ids[r.ID] = true
	}
	if count != keys || sum != want || balance != want {
		t.Fatalf("%d charges summing to %d, balances %d; want %d charges summing to %d", count, sum, balance, keys, want)
	}
}

// chaosReply is one answer, with its Location header.
type chaosReply struct {
	status   int
	replayed string
	location string
	body     string
}

// until201 posts until the answer is 201, retrying connection errors, 409
// and 503 with the same key.
func until201(t *testing.T, base, key, body string) (chaosReply, bool) {
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		r, err := chaosPost(base, key, body)
		switch {
		case err != nil, r.status == http.StatusConflict, r.status == http.StatusServiceUnavailable:
			time.Sleep(20 * time.Millisecond)
		case r.status == http.StatusCreated:
			return r, true
		default:
			t.Errorf("key %s: %d %q", key, r.status, r.body)
			return r, false
		}
	}
	return chaosReply{}, false
}

// untilAnswer posts until the server answers anything but 409 or 503.
func untilAnswer(t *testing.T, base, key, body string) chaosReply {
	for {
		r, err := chaosPost(base, key, body)
		if err == nil && r.status != http.StatusConflict && r.status != http.StatusServiceUnavailable {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var chaosClient = &http.Client{Timeout: 10 * time.Second}

func chaosPost(base, key, body string) (chaosReply, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/charges", strings.NewReader(body))
	if err != nil {
		return chaosReply{}, err
	}
	req.Header.Set("Authorization", "Bearer alice-token")
	req.Header.Set("Idempotency-Key", key)
	resp, err := chaosClient.Do(req)
	if err != nil {
		return chaosReply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return chaosReply{}, err
	}
	return chaosReply{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed"), location: resp.Header.Get("Location"), body: string(b)}, nil
}

// freeAddr returns a free 127.0.0.1 port's address.
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitUp waits until the server answers, failing if its process exits.
func waitUp(t *testing.T, base string, child *runtest.Child) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "/accounts/1")
		if err == nil {
			resp.Body.Close()
			return
		}
		select {
		case <-child.Done():
			t.Fatalf("server exited: %v\n%s", child.Err(), child.Output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not answer: %v\n%s", err, child.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
