package pgdedup_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup/deduptest"
	"github.com/idemq/idemq/dedup/pgdedup"
)

// TestReport checks, on the real PostgreSQL, the report of a table:
// records per scope, oldest and newest, the expired records not deleted,
// ages and sizes.
func TestReport(t *testing.T) {
	store, pool := newStore(t, pgdedup.Config{Table: "seen"})
	ctx := testCtx(t)
	claimCommit(t, store, "a", rec("a1", "x"), rec("a2", "x"), rec("a3", "x"))
	claimCommit(t, store, "b", rec("b1", "x"), rec("b2", "x"))
	table := pgx.Identifier{store.Config().Schema, "seen"}.Sanitize()
	oldest := time.Now().Add(-10 * 24 * time.Hour).Truncate(time.Microsecond)
	for _, q := range []struct {
		sql string
		arg any
	}{
		{`UPDATE ` + table + ` SET processed_at = $1 WHERE key = 'a2'`, oldest},
		{`UPDATE ` + table + ` SET processed_at = $1 WHERE key = 'a3'`, time.Now().Add(-2 * time.Hour)},
		{`UPDATE ` + table + ` SET expires_at = $1 WHERE key = 'b2'`, time.Now().Add(-time.Second)},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.arg); err != nil {
			t.Fatal(err)
		}
	}
	r, err := store.Report(ctx)
	if err != nil || !r.SizeKnown {
		t.Fatalf("Report: sizes known %v, %v; want known", r.SizeKnown, err)
	}
	deduptest.CheckReport(t, ctx, store, store.Config().Schema+".seen", oldest)
}

// TestReportPartitioned: the sizes of a partitioned table are its
// partitions' (the partitioned table itself has no storage).
func TestReportPartitioned(t *testing.T) {
	store, _ := newStore(t, pgdedup.Config{Partitioned: true})
	claimCommit(t, store, "a", rec("a1", "x"))
	r, err := store.Report(testCtx(t))
	if err != nil || !r.SizeKnown || r.TableBytes == 0 || r.IndexBytes == 0 {
		t.Fatalf("Report: %v; sizes known %v, table %d bytes, indexes %d bytes; want both above 0", err, r.SizeKnown, r.TableBytes, r.IndexBytes)
	}
}
