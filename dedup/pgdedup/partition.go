package pgdedup

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Partition maintenance of a partitioned table (Config.Partitioned).
const (
	// PartitionsAhead is how many days after the clock's day (UTC) Cleanup
	// keeps a partition for, so that a janitor outage of that long stops
	// no claim.
	PartitionsAhead = 2
	// PartitionLockTimeout bounds the wait of each partition's DDL for its
	// table lock (lock_timeout). A drop needs the table's exclusive lock,
	// which claims queue behind while it waits: the timeout bounds that
	// queue, and a drop that timed out is retried by the next Cleanup.
	PartitionLockTimeout = 100 * time.Millisecond
	// maxPartitionSteps bounds the DDL steps of one Cleanup.
	maxPartitionSteps = 64
)

// partitionLayout is "YYYYMMDD", the day of a partition's name.
const partitionLayout = "20060102"

// partitionsSQL lists the partitions of a table ($1): name, records as the
// statistics estimate them, and the bounds of their range (NULL for
// MINVALUE and MAXVALUE).
const partitionsSQL = `SELECT c.relname, greatest(c.reltuples, 0)::bigint,
(regexp_match(b.e, 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
(regexp_match(b.e, 'TO \(''([^'']*)''\)'))[1]::timestamptz
FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid,
LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS e) AS b
WHERE i.inhparent = to_regclass($1)`

// partition is a partition of the table, as partitionsSQL lists it.
type partition struct {
	name     string
	records  int64
	from, to *time.Time // nil: unbounded
}

// covers reports whether t is in p's range.
func (p partition) covers(t time.Time) bool {
	return (p.from == nil || !t.Before(*p.from)) && (p.to == nil || t.Before(*p.to))
}

// partitionName returns the name of the partition of day (UTC).
func (s *Store) partitionName(day time.Time) string {
	return s.cfg.Table + "_p" + day.UTC().Format(partitionLayout)
}

// partitioned reports whether the store's table is partitioned: the
// janitor of a partitioned store on a table not yet partitioned deletes
// rows.
func (s *Store) partitioned(ctx context.Context, db DBTX) (bool, error) {
	var kind string
	err := db.QueryRow(ctx, `SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '')`, s.q.table).Scan(&kind)
	return kind == "p", err
}

// maintainPartitions creates the partitions of the clock's day and the
// PartitionsAhead days after it, and drops every partition whose records
// all expired (its day ended at least Retention ago, and a scan finds no
// record of a store with a longer retention), one DDL statement
// per transaction, each under the janitor's advisory lock and
// PartitionLockTimeout. It returns the records the dropped partitions held
// (as the planner's statistics estimate them), and busy when another
// process holds the lock. A failed or interrupted step leaves nothing
// behind (its transaction rolls back); the next call does it again.
func (s *Store) maintainPartitions(ctx context.Context) (dropped int64, busy bool, err error) {
	for range maxPartitionSteps {
		n, done, busy, err := s.partitionStep(ctx)
		dropped += n
		if err != nil || busy || done {
			return dropped, busy, err
		}
	}
	return dropped, false, nil
}

// partitionStep takes the advisory lock, lists the partitions, and creates
// or drops one. done is true when there was nothing to do.
func (s *Store) partitionStep(ctx context.Context) (dropped int64, done, busy bool, err error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return 0, false, false, fmt.Errorf("pgdedup: partitions: %w", err)
	}
	defer tx.Rollback(ctx) // safe after commit
	var locked bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtext($1))`, s.lockKey()).Scan(&locked); err != nil {
		return 0, false, false, fmt.Errorf("pgdedup: partitions: %w", err)
	}
	if !locked {
		return 0, false, true, nil
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, PartitionLockTimeout.Milliseconds())); err != nil {
		return 0, false, false, fmt.Errorf("pgdedup: partitions: %w", err)
	}
	rows, err := tx.Query(ctx, partitionsSQL, s.q.table)
	if err != nil {
		return 0, false, false, fmt.Errorf("pgdedup: partitions: %w", err)
	}
	var (
		have []partition
		p    partition
	)
	if _, err := pgx.ForEachRow(rows, []any{&p.name, &p.records, &p.from, &p.to}, func() error { have = append(have, p); return nil }); err != nil {
		return 0, false, false, fmt.Errorf("pgdedup: partitions: %w", err)
	}

	now := s.cfg.Now()
	var step string
	for _, p := range have {
		if p.to == nil || p.to.Add(s.cfg.Retention).After(now) {
			continue
		}
		// Past this store's retention; stores of other scopes on the
		// table may keep theirs longer. The first unexpired record ends
		// the scan.
		name := pgx.Identifier{s.cfg.Schema, p.name}.Sanitize()
		var kept bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+name+` WHERE expires_at > $1)`, now).Scan(&kept); err != nil {
			return 0, false, false, fmt.Errorf("pgdedup: partitions: %w", err)
		}
		if !kept {
			step, dropped = `DROP TABLE `+name, p.records
			break
		}
	}
	u := now.UTC()
	today := time.Date(u.Year(), u.Month(), u.Day(), 0, 0, 0, 0, time.UTC)
	for d := 0; step == "" && d <= PartitionsAhead; d++ {
		day := today.AddDate(0, 0, d)
		if slices.ContainsFunc(have, func(p partition) bool { return p.covers(day) }) {
			continue
		}
		// CREATE TABLE ... PARTITION OF would take the parent's exclusive
		// lock; ATTACH PARTITION takes a lock that claims do not conflict
		// with.
		parent, p := s.q.table, pgx.Identifier{s.cfg.Schema, s.partitionName(day)}.Sanitize()
		step = fmt.Sprintf(`CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS);
ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`,
			p, parent, parent, p, day.Format(time.RFC3339), day.AddDate(0, 0, 1).Format(time.RFC3339))
	}
	if step == "" {
		return 0, true, false, nil
	}
	if _, err := tx.Exec(ctx, step); err != nil {
		return 0, false, false, fmt.Errorf("pgdedup: partitions: %s: %w", strings.SplitN(step, " (", 2)[0], err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, false, fmt.Errorf("pgdedup: partitions: %w", err)
	}
	s.cfg.Logger.DebugContext(ctx, "pgdedup: partition maintenance", "step", strings.SplitN(step, " (", 2)[0])
	return dropped, false, false, nil
}
