// Package pgpart maintains a PostgreSQL table partitioned by range of a
// timestamp, one partition per day (UTC), named <table>_pYYYYMMDD: it
// creates the partitions of the coming days and drops those that hold no
// row still needed, one DDL statement per transaction under an advisory
// lock. pgdedup and the outbox's relay use it.
package pgpart

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// Ahead is how many days after the clock's day (UTC) Maintain keeps a
	// partition for, so that a maintenance outage of that long stops no
	// write.
	Ahead = 2
	// LockTimeout bounds the wait of each partition's DDL for its table
	// lock (lock_timeout). A drop needs the table's exclusive lock, which
	// writers queue behind while it waits: the timeout bounds that queue.
	// A step that timed out is tried again, up to Retries times, within
	// the same Maintain, then by the next Maintain.
	LockTimeout = 100 * time.Millisecond
	// Retries is how many more times Maintain tries a step that failed on
	// LockTimeout (SQLSTATE 55P03), after a pause of 50 to 250 ms
	// (jittered, so that the lock's holder and queue can move on).
	Retries = 2
	// maxSteps bounds the DDL steps of one Maintain.
	maxSteps = 64
)

// layout is "YYYYMMDD", the day of a partition's name.
const layout = "20060102"

// listSQL lists the partitions of a table ($1): name, rows as the
// statistics estimate them, and the bounds of their range (NULL for
// MINVALUE and MAXVALUE).
const listSQL = `SELECT c.relname, greatest(c.reltuples, 0)::bigint,
(regexp_match(b.e, 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
(regexp_match(b.e, 'TO \(''([^'']*)''\)'))[1]::timestamptz
FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid,
LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS e) AS b
WHERE i.inhparent = to_regclass($1)`

// Beginner opens transactions: *pgxpool.Pool, *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Table is a table partitioned by day, and how to maintain it.
type Table struct {
	// DB opens the transaction of each step.
	DB Beginner
	// Schema holds the table; "" finds it through search_path (the
	// partitions are then created in the table's schema by name only).
	Schema string
	// Name is the table's name, unqualified.
	Name string
	// LockKey names the advisory lock (hashtext) that one maintainer at a
	// time holds.
	LockKey string
	// Retention is how long after a partition's last day it is kept at
	// least; after it, Kept decides.
	Retention time.Duration
	// Now is the clock that picks the days.
	Now func() time.Time
	// Kept reports whether the partition (a qualified, quoted name) holds a
	// row still needed at now: it is dropped only when not. It runs in the
	// step's transaction.
	Kept func(ctx context.Context, tx pgx.Tx, partition string, now time.Time) (bool, error)
	// Prefix starts the errors' and logs' messages ("pgdedup").
	Prefix string
	// Logger receives a debug record per step.
	Logger *slog.Logger
}

// partition is a partition of the table, as listSQL lists it.
type partition struct {
	name     string
	rows     int64
	from, to *time.Time // nil: unbounded
}

// covers reports whether t is in p's range.
func (p partition) covers(t time.Time) bool {
	return (p.from == nil || !t.Before(*p.from)) && (p.to == nil || t.Before(*p.to))
}

// PartitionName returns the name of the partition of day (UTC).
func (t *Table) PartitionName(day time.Time) string {
	return t.Name + "_p" + day.UTC().Format(layout)
}

// qualified returns name qualified with the table's schema, quoted.
func (t *Table) qualified(name string) string {
	if t.Schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, name}.Sanitize()
}

// Partitioned reports whether the table is partitioned.
func (t *Table) Partitioned(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (bool, error) {
	var kind string
	err := db.QueryRow(ctx, `SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '')`, t.qualified(t.Name)).Scan(&kind)
	return kind == "p", err
}

// Maintain creates the partitions of the clock's day and the Ahead days
// after it, and drops every partition whose day ended at least Retention
// ago and that Kept finds nothing to keep in, one DDL statement per
// transaction, each under the advisory lock and LockTimeout. It returns
// the rows the dropped partitions held (as the planner's statistics
// estimate them), and busy when another process holds the lock. A failed
// or interrupted step leaves nothing behind (its transaction rolls back);
// the next call does it again, and a step that timed out waiting for a
// lock is tried again first (Retries).
func (t *Table) Maintain(ctx context.Context) (dropped int64, busy bool, err error) {
	retries := Retries
	for range maxSteps {
		n, done, busy, err := t.step(ctx)
		dropped += n
		if err != nil && retries > 0 && lockTimedOut(err) {
			retries--
			pause := time.NewTimer(50*time.Millisecond + rand.N(200*time.Millisecond))
			select {
			case <-ctx.Done():
				pause.Stop()
				return dropped, false, err
			case <-pause.C:
			}
			continue
		}
		if err != nil || busy || done {
			return dropped, busy, err
		}
		retries = Retries
	}
	return dropped, false, nil
}

// lockTimedOut reports whether err is a statement's lock_timeout (SQLSTATE
// 55P03, lock_not_available).
func lockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// step takes the advisory lock, lists the partitions, and creates or drops
// one. done is true when there was nothing to do.
func (t *Table) step(ctx context.Context) (dropped int64, done, busy bool, err error) {
	fail := func(err error) (int64, bool, bool, error) {
		return 0, false, false, fmt.Errorf("%s: partitions: %w", t.Prefix, err)
	}
	tx, err := t.DB.Begin(ctx)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback(ctx) // safe after commit
	var locked bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtext($1))`, t.LockKey).Scan(&locked); err != nil {
		return fail(err)
	}
	if !locked {
		return 0, false, true, nil
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, LockTimeout.Milliseconds())); err != nil {
		return fail(err)
	}
	parent := t.qualified(t.Name)
	rows, err := tx.Query(ctx, listSQL, parent)
	if err != nil {
		return fail(err)
	}
	var (
		have []partition
		p    partition
	)
	if _, err := pgx.ForEachRow(rows, []any{&p.name, &p.rows, &p.from, &p.to}, func() error { have = append(have, p); return nil }); err != nil {
		return fail(err)
	}

	now := t.Now()
	var step string
	for _, p := range have {
		if p.to == nil || p.to.Add(t.Retention).After(now) {
			continue
		}
		name := t.qualified(p.name)
		kept, err := t.Kept(ctx, tx, name, now)
		if err != nil {
			return fail(err)
		}
		if !kept {
			step, dropped = `DROP TABLE `+name, p.rows
			break
		}
	}
	u := now.UTC()
	today := time.Date(u.Year(), u.Month(), u.Day(), 0, 0, 0, 0, time.UTC)
	for d := 0; step == "" && d <= Ahead; d++ {
		day := today.AddDate(0, 0, d)
		if slices.ContainsFunc(have, func(p partition) bool { return p.covers(day) }) {
			continue
		}
		// CREATE TABLE ... PARTITION OF would take the parent's exclusive
		// lock; ATTACH PARTITION takes a lock that writes do not conflict
		// with.
		p := t.qualified(t.PartitionName(day))
		step = fmt.Sprintf(`CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS);
ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`,
			p, parent, parent, p, day.Format(time.RFC3339), day.AddDate(0, 0, 1).Format(time.RFC3339))
	}
	if step == "" {
		return 0, true, false, nil
	}
	verb := strings.SplitN(step, " (", 2)[0]
	if _, err := tx.Exec(ctx, step); err != nil {
		return fail(fmt.Errorf("%s: %w", verb, err))
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(err)
	}
	t.Logger.DebugContext(ctx, t.Prefix+": partition maintenance", "step", verb)
	return dropped, false, false, nil
}
