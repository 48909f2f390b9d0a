package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolCloseWait bounds the wait of ClosePoolAtCleanup for the connections a
// test still holds.
const PoolCloseWait = 10 * time.Second

// ClosePoolAtCleanup closes pool when t ends. pgxpool's Close waits for
// every acquired connection to be released, so a test that fails while it
// holds one (an open transaction, rows not closed) would hang in its
// cleanup until go test's -timeout, which names no test. Here the cleanup
// waits at most PoolCloseWait, then reports the held connections as an
// error of t and leaves the pool behind, so the failure shows in seconds
// with the test's name. Tests should still release what they hold before
// they fail (defer the rollback); this is the net under that rule.
func ClosePoolAtCleanup(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() {
			pool.Close()
			close(done)
		}()
		timer := time.NewTimer(PoolCloseWait)
		defer timer.Stop()
		select {
		case <-done:
		case <-timer.C:
			t.Errorf("pgxpool.Close still waits after %s: the test holds %d connection(s) (a transaction not rolled back, rows not closed); left open",
				PoolCloseWait, pool.Stat().AcquiredConns())
		}
	})
}

// SchemaPool returns a pool on the test database (DatabaseURL) and a new
// schema of the test's (Schema). The pool keeps the server's search_path;
// it is closed when the test ends (ClosePoolAtCleanup), before the schema
// is dropped.
func SchemaPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	url := DatabaseURL(t)
	schema := Schema(t, url)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	ClosePoolAtCleanup(t, pool)
	return pool, schema
}
