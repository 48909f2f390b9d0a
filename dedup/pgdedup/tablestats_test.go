package pgdedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
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

	jctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- store.RunJanitor(jctx) }()
	var st dedup.TableStats
	for {
		var ok bool
		if st, ok = store.TableStats(); ok && !st.At.Before(before) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the janitor reported no measurement in time")
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(st.Scopes) != 2 || st.Scopes[0].Scope != "a" || st.Scopes[1].Scope != "b" {
		t.Fatalf("scopes %+v, want a and b", st.Scopes)
	}
	if a := st.Scopes[0]; a.Records != 3 || !a.Oldest.Equal(oldest) {
		t.Errorf("scope a: %d records, oldest %v; want 3, %v", a.Records, a.Oldest, oldest)
	}
	if b := st.Scopes[1]; b.Records != 1 {
		t.Errorf("scope b: %d records, want 1 (the expired one deleted first)", b.Records)
	}
	if st.Records() != 4 {
		t.Errorf("Records() = %d, want 4", st.Records())
	}
}
