package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// dialect writes the relay's statements on the outbox table for one
// database. PostgreSQL keeps times as timestamptz and durations as
// intervals; SQLite keeps both as (Unix) milliseconds.
type dialect struct {
	table string // the outbox table's name, qualified with its schema
	now   string // the time now
	// interval is the duration held by the parameter p, which holds
	// duration's result.
	interval func(p string) string
	duration func(time.Duration) any
	// millisSince is the number of milliseconds since the time t.
	millisSince func(t string) string
	// in is the condition that col is one of the values of the parameter
	// p, which holds list's result for a []string or a []int64.
	in   func(col, p string) string
	list func(v any) any
	// skipLocked locks the selected rows of alias, skipping those another
	// transaction locked; SQLite has no row locks.
	skipLocked func(alias string) string
}

// postgres is the dialect of PostgreSQL, over table.
func postgres(table string) dialect {
	return dialect{
		table:       table,
		now:         "now()",
		interval:    func(p string) string { return "make_interval(secs => " + p + ")" },
		duration:    func(d time.Duration) any { return d.Seconds() },
		millisSince: func(t string) string { return "(extract(epoch FROM now() - " + t + ") * 1000)::bigint" },
		in:          func(col, p string) string { return col + " = ANY(" + p + ")" },
		list:        func(v any) any { return v },
		skipLocked:  func(alias string) string { return "\nFOR UPDATE OF " + alias + " SKIP LOCKED" },
	}
}

// sqliteNow is the time now on SQLite in Unix milliseconds, as the
// migration's created_at default computes it.
const sqliteNow = `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`

// sqlite is the dialect of SQLite, whose table is Table (no schemas).
var sqlite = dialect{
	table:       Table,
	now:         sqliteNow,
	interval:    func(p string) string { return p },
	duration:    func(d time.Duration) any { return d.Milliseconds() },
	millisSince: func(t string) string { return sqliteNow + " - " + t },
	in:          func(col, p string) string { return col + " IN (SELECT value FROM json_each(" + p + "))" },
	list: func(v any) any {
		b, _ := json.Marshal(v) // a slice of strings or numbers always encodes
		return string(b)
	},
	skipLocked: func(string) string { return "" },
}

// claimSQL selects the eligible rows: pending, due, and the oldest pending
// row of their key (rows without a key are not ordered); $1 is the most to
// select. On PostgreSQL, rows another relay locked are skipped; their key's
// later rows are not eligible, because the locked row is still pending.
func (d dialect) claimSQL() string {
	return `SELECT o.seq, o.attempts, o.id, o.destination, o.partition_key, o.routing_key, o.headers, o.body
FROM ` + d.table + ` o
WHERE o.state = 0
  AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= ` + d.now + `)
  AND (o.partition_key = '' OR NOT EXISTS (
        SELECT 1 FROM ` + d.table + ` p
        WHERE p.state = 0 AND p.partition_key = o.partition_key AND p.seq < o.seq))
ORDER BY o.seq
LIMIT $1` + d.skipLocked("o")
}

// stmt is a statement and its arguments.
type stmt struct {
	sql  string
	args []any
}

// finishSQL returns the statements that record the outcome of a claimed
// batch: the rows of sent are marked sent (deleted with deleteSent), the
// failed ones count an attempt and are retried later or parked.
func (d dialect) finishSQL(sent []int64, failed []failure, deleteSent bool) []stmt {
	var out []stmt
	if len(sent) > 0 {
		q := `UPDATE ` + d.table + ` SET state = 1, sent_at = ` + d.now + ` WHERE ` + d.in("seq", "$1")
		if deleteSent {
			q = `DELETE FROM ` + d.table + ` WHERE ` + d.in("seq", "$1")
		}
		out = append(out, stmt{q, []any{d.list(sent)}})
	}
	for _, f := range failed {
		state := statePending
		if f.park {
			state = stateParked
		}
		out = append(out, stmt{`UPDATE ` + d.table + ` SET attempts = attempts + 1, last_error = $2, state = $3,
			next_attempt_at = ` + d.now + ` + ` + d.interval("$4") + ` WHERE seq = $1`,
			[]any{f.seq, f.err, state, d.duration(f.nextRetry)}})
	}
	return out
}

// scanClaimed reads a row of claimSQL into r.
func scanClaimed(scan func(dest ...any) error, r *row) error {
	var headers string
	if err := scan(&r.seq, &r.attempts, &r.msg.ID, &r.msg.Destination, &r.msg.Key, &r.msg.RoutingKey, &headers, &r.msg.Body); err != nil {
		return err
	}
	if headers == "" || headers == "{}" {
		return nil
	}
	if err := json.Unmarshal([]byte(headers), &r.msg.Headers); err != nil {
		return fmt.Errorf("decode headers of %s: %w", r.msg.ID, err)
	}
	return nil
}

// rows are the rows of a query: pgx.Rows fits, and *sql.Rows in sqlRows.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// scanAll reads every row of rs into a T with scan, given the row's Scan,
// then closes rs; err is the error of the query that returned rs.
func scanAll[T any](rs rows, err error, scan func(rowScan func(dest ...any) error, v *T) error) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []T
	for rs.Next() {
		var v T
		if err := scan(rs.Scan, &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rs.Err()
}

// runner runs statements outside a claim, on a pgx pool or a database/sql
// DB.
type runner interface {
	// exec runs q and returns the number of rows it affected.
	exec(ctx context.Context, q string, args ...any) (int64, error)
	query(ctx context.Context, q string, args ...any) (rows, error)
}

// sqlTable is the part of a store that is the same on both databases.
type sqlTable struct {
	dialect
	run runner
}

// cleanup deletes up to n rows sent more than retention ago and returns
// how many.
func (t sqlTable) cleanup(ctx context.Context, retention time.Duration, n int) (int64, error) {
	return t.run.exec(ctx, `DELETE FROM `+t.table+` WHERE seq IN (
		SELECT c.seq FROM `+t.table+` c WHERE c.state = 1 AND c.sent_at < `+t.now+` - `+t.interval("$1")+`
		LIMIT $2`+t.skipLocked("c")+`)`, t.duration(retention), n)
}

func (t sqlTable) counts(ctx context.Context) (Counts, error) {
	rs, err := t.run.query(ctx, countsSQL(t.dialect))
	c, err := scanAll(rs, err, scanCounts)
	if err != nil {
		return Counts{}, err
	}
	return c[0], nil // an aggregate without GROUP BY has one row
}

func (t sqlTable) failures(ctx context.Context, n int) ([]FailureGroup, error) {
	rs, err := t.run.query(ctx, failuresSQL(t.table), n)
	return scanAll(rs, err, func(scan func(dest ...any) error, g *FailureGroup) error {
		return scan(&g.Destination, &g.RoutingKey, &g.Error, &g.Failing, &g.Parked, &g.LastID)
	})
}

// parkedWhere is the condition on the parked rows of ids (all of them
// when ids is empty), and its arguments.
func (t sqlTable) parkedWhere(ids []string) (string, []any) {
	if len(ids) == 0 {
		return "state = 2", nil
	}
	return "state = 2 AND " + t.in("id", "$1"), []any{t.list(ids)}
}

func (t sqlTable) parked(ctx context.Context, ids []string, n int) ([]ParkedRow, error) {
	where, args := t.parkedWhere(ids)
	q := `SELECT id, destination, routing_key, partition_key, attempts, coalesce(last_error, ''), created_at
		FROM ` + t.table + ` WHERE ` + where + ` ORDER BY seq`
	if n > 0 {
		args = append(args, n)
		q += fmt.Sprintf(" LIMIT $%d", len(args))
	}
	rs, err := t.run.query(ctx, q, args...)
	return scanAll(rs, err, func(scan func(dest ...any) error, p *ParkedRow) error {
		return scan(&p.ID, &p.Destination, &p.RoutingKey, &p.Key, &p.Attempts, &p.LastError, (*dbTime)(&p.Created))
	})
}

func (t sqlTable) unpark(ctx context.Context, ids []string) (int64, error) {
	where, args := t.parkedWhere(ids)
	return t.run.exec(ctx, `UPDATE `+t.table+` SET state = 0, attempts = 0, next_attempt_at = NULL WHERE `+where, args...)
}

// dbTime scans a time column: a timestamptz on PostgreSQL, Unix
// milliseconds on SQLite.
type dbTime time.Time

var _ sql.Scanner = (*dbTime)(nil)

func (t *dbTime) Scan(v any) error {
	switch v := v.(type) {
	case time.Time:
		*t = dbTime(v)
	case int64:
		*t = dbTime(time.UnixMilli(v))
	default:
		return fmt.Errorf("scan %T as a time", v)
	}
	return nil
}
