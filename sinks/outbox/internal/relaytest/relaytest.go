// Package relaytest holds the test fixtures the outbox publishers share: a
// PostgreSQL schema with the outbox table, rows, relays, and the checks that
// every row arrived once and in order per key.
package relaytest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
)

// WaitTimeout bounds every wait of the tests.
const WaitTimeout = 90 * time.Second

// Logger logs to stderr at Debug when IDEMQ_TEST_LOG=1, else discards.
func Logger() *slog.Logger {
	if os.Getenv("IDEMQ_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// NewPool returns a pool on a fresh schema with the outbox table, and the
// schema's name and URL.
func NewPool(t testing.TB) (*pgxpool.Pool, string, string) {
	t.Helper()
	ctx := context.Background()
	schema := testenv.Schema(t, testenv.DatabaseURL(t))
	u, err := testenv.WithSearchPath(testenv.DatabaseURL(t), schema)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	MigrateOutbox(t, pool, migrate.Config{})
	return pool, schema, u
}

// Messages returns n messages to dest with explicit ids prefix-0000...,
// spread over keys partition keys (k-0, k-1, ...), with the index as body.
func Messages(prefix, dest string, n, keys int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{
			ID:          fmt.Sprintf("%s-%05d", prefix, i),
			Destination: dest,
			Key:         "k-" + strconv.Itoa(i%keys),
			Headers:     map[string]string{"index": strconv.Itoa(i)},
			Body:        []byte(strconv.Itoa(i)),
		}
	}
	return msgs
}

// Insert publishes msgs into the outbox in transactions of up to 100.
func Insert(t testing.TB, pool *pgxpool.Pool, msgs []outbox.Message) {
	t.Helper()
	ctx := context.Background()
	for len(msgs) > 0 {
		n := min(len(msgs), 100)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs[:n] {
			if _, err := outbox.Publish(ctx, tx, m); err != nil {
				_ = tx.Rollback(ctx)
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		msgs = msgs[n:]
	}
}

// FastConfig is a relay config for tests: quick retries and polls.
func FastConfig() outbox.Config {
	return outbox.Config{
		BatchSize:      50,
		PollInterval:   200 * time.Millisecond,
		MaxAttempts:    3,
		InitialBackoff: 20 * time.Millisecond,
		MaxBackoff:     200 * time.Millisecond,
		Logger:         Logger(),
	}
}

// StartRelays runs n relays over pool until the test ends or stop is
// called.
func StartRelays(t testing.TB, pool *pgxpool.Pool, pub outbox.Publisher, n int, cfg outbox.Config) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		r, err := outbox.NewRelay(pool, pub, cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("relay: %v", err)
			}
		}()
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// Counts returns the outbox's row counts.
func Counts(t testing.TB, pool *pgxpool.Pool) outbox.Counts {
	t.Helper()
	var c outbox.Counts
	err := pool.QueryRow(context.Background(), `SELECT
		count(*) FILTER (WHERE state = 0), count(*) FILTER (WHERE state = 1), count(*) FILTER (WHERE state = 2)
		FROM idemq_outbox`).Scan(&c.Pending, &c.Sent, &c.Parked)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Describe returns the outbox's counts and the distinct errors of failed
// rows, for a failure message.
func Describe(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	c := Counts(t, pool)
	s := fmt.Sprintf("pending=%d sent=%d parked=%d", c.Pending, c.Sent, c.Parked)
	rows, err := pool.Query(context.Background(), `SELECT DISTINCT last_error FROM idemq_outbox WHERE last_error IS NOT NULL LIMIT 5`)
	if err != nil {
		return s
	}
	defer rows.Close()
	for rows.Next() {
		var e string
		if rows.Scan(&e) == nil {
			s += "\n  error: " + e
		}
	}
	return s
}

// WaitFor polls cond until it holds, failing the test after WaitTimeout
// with what describe says.
func WaitFor(t testing.TB, describe func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", describe())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Got is a message as a broker delivered it.
type Got struct {
	// ID is the stable id the message carried.
	ID string
	// Key is its partition key.
	Key string
	// Body is its payload.
	Body string
}

// Check verifies that got has every message of want, with the right key
// and body, each exactly once (or at least once, when dups is true), and
// that the messages of each key arrived in want's order: got must list
// each key's messages in the order the broker delivered them. It returns
// the number of duplicate deliveries.
func Check(t testing.TB, want []outbox.Message, got []Got, dups bool) int {
	t.Helper()
	index := make(map[string]int, len(want))
	for i, m := range want {
		index[m.ID] = i
	}
	seen := make(map[string]int, len(want))
	last := map[string]int{} // key -> index of its last delivered message
	duplicates := 0
	for _, g := range got {
		i, ok := index[g.ID]
		if !ok {
			t.Fatalf("unexpected message id %q", g.ID)
		}
		m := want[i]
		if g.Key != m.Key || g.Body != string(m.Body) {
			t.Fatalf("message %s arrived with key %q body %q, want %q %q", g.ID, g.Key, g.Body, m.Key, m.Body)
		}
		seen[g.ID]++
		if seen[g.ID] > 1 {
			duplicates++
		}
		if l, ok := last[g.Key]; ok && i < l {
			t.Fatalf("key %s: message %s (index %d) arrived after index %d", g.Key, g.ID, i, l)
		}
		last[g.Key] = i
	}
	for _, m := range want {
		if seen[m.ID] == 0 {
			t.Fatalf("message %s never arrived (%d of %d arrived)", m.ID, len(seen), len(want))
		}
	}
	if duplicates > 0 && !dups {
		t.Fatalf("%d duplicate deliveries", duplicates)
	}
	return duplicates
}

// MigrateOutbox creates the outbox table through pool, with cfg's Schema
// (empty: the first of the pool's search_path).
func MigrateOutbox(t testing.TB, pool *pgxpool.Pool, cfg migrate.Config) {
	t.Helper()
	cfg.Line = migrate.Outbox
	m, err := migrate.NewPgx(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
}
