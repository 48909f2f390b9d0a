package pgpart_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/pgpart"
	"github.com/idemq/idemq/internal/testenv"
)

// TestMaintainRetriesLockTimeout: a drop whose partition a transaction
// holds a little longer than LockTimeout succeeds within one Maintain, as
// the step is tried again once the lock is gone.
func TestMaintainRetriesLockTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, schema := testenv.SchemaPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "events"}.Sanitize()+` (at timestamptz NOT NULL) PARTITION BY RANGE (at)`); err != nil {
		t.Fatal(err)
	}
	day0 := time.Date(2030, 3, 10, 12, 0, 0, 0, time.UTC)
	now := day0
	table := &pgpart.Table{
		DB: pool, Schema: schema, Name: "events", LockKey: schema + ".events", Retention: 24 * time.Hour,
		Now:    func() time.Time { return now },
		Kept:   func(context.Context, pgx.Tx, string, time.Time) (bool, error) { return false, nil },
		Prefix: "pgpart", Logger: slog.New(slog.DiscardHandler),
	}
	if _, _, err := table.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	first := pgx.Identifier{schema, table.PartitionName(day0)}.Sanitize()
	hold := 180 * time.Millisecond
	if hold <= pgpart.LockTimeout {
		t.Fatalf("the lock is held %v, not longer than LockTimeout (%v)", hold, pgpart.LockTimeout)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE `+first+` IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	time.AfterFunc(hold, func() { released <- tx.Rollback(ctx) })

	now = day0.AddDate(0, 0, 2)
	_, busy, err := table.Maintain(ctx)
	if err != nil || busy {
		t.Fatalf("Maintain while a transaction held the partition for %v: busy %v, %v; want the drop done once it is released", hold, busy, err)
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	var left bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, first).Scan(&left); err != nil || left {
		t.Fatalf("partition %s after Maintain: exists %v, %v; want dropped", first, left, err)
	}
}
