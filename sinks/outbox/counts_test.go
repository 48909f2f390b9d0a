package outbox_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
)

// Schema.Counts counts the outbox rows per state without a relay, with the
// ages of the oldest pending and parked rows, on SQLite and on the real
// PostgreSQL (through database/sql, in a schema off the search_path).
func TestSchemaCounts(t *testing.T) {
	rows := []struct {
		state, attempts int
		age             time.Duration
	}{
		{0, 0, time.Hour}, {0, 1, time.Minute}, // pending, one of them failing
		{1, 1, 3 * time.Hour}, // sent
		{2, 5, 2 * time.Hour}, // parked
	}
	for _, d := range []migrate.Dialect{migrate.SQLite, migrate.Postgres} {
		t.Run(string(d), func(t *testing.T) {
			ctx := context.Background()
			var db *sql.DB
			var schema outbox.Schema
			table, ph, created := outbox.Table, "?", func(t time.Time) any { return t.UnixMilli() }
			if d == migrate.SQLite {
				db = newSQLite(t)
			} else {
				url := testenv.DatabaseURL(t)
				schema = outbox.Schema(testenv.Schema(t, url))
				var err error
				if db, err = sql.Open("pgx", url); err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				m, err := migrate.NewSQL(db, migrate.Config{Line: migrate.Outbox, Schema: string(schema)})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := m.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				table, ph, created = `"`+string(schema)+`".`+outbox.Table, "$", func(t time.Time) any { return t }
			}
			if _, err := schema.Counts(ctx, db, d); err != nil {
				t.Fatalf("Counts of an empty table: %v", err)
			}
			now := time.Now()
			for i, r := range rows {
				q := `INSERT INTO ` + table + ` (id, destination, body, state, attempts, created_at) VALUES (` +
					ph + `1, 'd', ` + ph + `2, ` + ph + `3, ` + ph + `4, ` + ph + `5)`
				if _, err := db.ExecContext(ctx, q, "e"+strconv.Itoa(i), []byte{0}, r.state, r.attempts, created(now.Add(-r.age))); err != nil {
					t.Fatal(err)
				}
			}
			c, err := schema.Counts(ctx, db, d)
			if err != nil {
				t.Fatal(err)
			}
			if c.Pending != 2 || c.Failing != 1 || c.Sent != 1 || c.Parked != 1 {
				t.Errorf("Counts = %+v; want 2 pending (1 failing), 1 sent, 1 parked", c)
			}
			if c.OldestPending < 59*time.Minute || c.OldestPending > 61*time.Minute {
				t.Errorf("OldestPending = %v, want an hour", c.OldestPending)
			}
			if c.OldestParked < 119*time.Minute || c.OldestParked > 121*time.Minute {
				t.Errorf("OldestParked = %v, want two hours", c.OldestParked)
			}
		})
	}
	if _, err := outbox.Schema("billing").Counts(context.Background(), &sql.DB{}, migrate.SQLite); err == nil {
		t.Error("Counts with a schema on SQLite: no error")
	}
}
