package pgdedup_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/deduptest"
	"github.com/idemq/idemq/dedup/pgdedup"
)

// TestJanitorMeasuresTable checks, on the real PostgreSQL, that the janitor
// measures the table after its cleanup: records per scope (the expired ones
// deleted) and the oldest record's processing time.
func TestJanitorMeasuresTable(t *testing.T) {
	store, pool := newStore(t, pgdedup.Config{CleanupInterval: 20 * time.Millisecond, StatsInterval: time.Millisecond})
	var _ dedup.TableStatsReporter = store
	ctx := testCtx(t)
	if _, ok := store.TableStats(); ok {
		t.Fatal("TableStats reported a measurement before the janitor ran")
	}
	claimCommit(t, store, "a", rec("a1", "x"), rec("a2", "x"), rec("a3", "x"))
	claimCommit(t, store, "b", rec("b1", "x"), rec("b2", "x"))
	table := pgx.Identifier{store.Config().Schema, "processed_messages"}.Sanitize()
	oldest := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET processed_at = $1 WHERE key = 'a2'`, oldest); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET expires_at = now() - interval '1 second' WHERE key = 'b2'`); err != nil {
		t.Fatal(err)
	}
	before := time.Now()

	deduptest.CheckJanitorStats(t, ctx, store, before, oldest)
}
