package sqldedup_test

import (
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/deduptest"
	"github.com/idemq/idemq/dedup/sqldedup"
)

// TestReport checks, on SQLite and the real PostgreSQL, the report of a
// table: records per scope, oldest and newest, the expired records not
// deleted, ages and sizes.
func TestReport(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			store, db := open(t, sqldedup.Config{Table: "seen"})
			ctx := testCtx(t)
			claimCommit(t, store, "a", rec("a1", "x"), rec("a2", "x"), rec("a3", "x"))
			claimCommit(t, store, "b", rec("b1", "x"), rec("b2", "x"))
			c := store.Config()
			table, name, ph := `"seen"`, "seen", "?"
			if c.Dialect == sqldedup.Postgres {
				table, name, ph = `"`+c.Schema+`"."seen"`, c.Schema+".seen", "$1"
			}
			oldest := time.Now().Add(-10 * 24 * time.Hour).Truncate(time.Microsecond)
			at := func(t time.Time) any {
				if c.Dialect == sqldedup.SQLite {
					return t.UnixMicro()
				}
				return t
			}
			for _, q := range []struct {
				sql string
				arg any
			}{
				{`UPDATE ` + table + ` SET processed_at = ` + ph + ` WHERE key = 'a2'`, at(oldest)},
				{`UPDATE ` + table + ` SET processed_at = ` + ph + ` WHERE key = 'a3'`, at(time.Now().Add(-2 * time.Hour))},
				{`UPDATE ` + table + ` SET expires_at = ` + ph + ` WHERE key = 'b2'`, at(time.Now().Add(-time.Second))},
			} {
				if _, err := db.ExecContext(ctx, q.sql, q.arg); err != nil {
					t.Fatal(err)
				}
			}
			deduptest.CheckReport(t, ctx, store, name, oldest)
		})
	}
}
