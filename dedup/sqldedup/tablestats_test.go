package sqldedup_test

import (
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/deduptest"
	"github.com/idemq/idemq/dedup/sqldedup"
)

// TestJanitorMeasuresTable checks, on SQLite and the real PostgreSQL, that
// the janitor measures the table after its cleanup: records per scope (the
// expired ones deleted) and the oldest record's processing time.
func TestJanitorMeasuresTable(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			store, db := open(t, sqldedup.Config{CleanupInterval: 20 * time.Millisecond, StatsInterval: time.Millisecond})
			var _ dedup.TableStatsReporter = store
			ctx := testCtx(t)
			if _, ok := store.TableStats(); ok {
				t.Fatal("TableStats reported a measurement before the janitor ran")
			}
			claimCommit(t, store, "a", rec("a1", "x"), rec("a2", "x"), rec("a3", "x"))
			claimCommit(t, store, "b", rec("b1", "x"), rec("b2", "x"))
			oldest := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
			c := store.Config()
			setOldest := `UPDATE "processed_messages" SET processed_at = ? WHERE key = 'a2'`
			expire := `UPDATE "processed_messages" SET expires_at = 0 WHERE key = 'b2'`
			var arg any = oldest.UnixMicro()
			if c.Dialect == sqldedup.Postgres {
				setOldest = `UPDATE "` + c.Schema + `"."processed_messages" SET processed_at = $1 WHERE key = 'a2'`
				expire = `UPDATE "` + c.Schema + `"."processed_messages" SET expires_at = now() - interval '1 second' WHERE key = 'b2'`
				arg = oldest
			}
			if _, err := db.ExecContext(ctx, setOldest, arg); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, expire); err != nil {
				t.Fatal(err)
			}
			before := time.Now()

			deduptest.CheckJanitorStats(t, ctx, store, before, oldest)
		})
	}
}
