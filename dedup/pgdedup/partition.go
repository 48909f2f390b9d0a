package pgdedup

import (
	"context"
	"fmt"
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
// all expired (its day ended at least Retention ago), one DDL statement
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
	rows, err := tx.Query(ctx, `SELECT c.relname, greatest(c.reltuples, 0)::bigint FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1)`, s.q.table)
	if err != nil {
		return 0, false, false, fmt.Errorf("pgdedup: partitions: %w", err)
	}
	have := map[string]int64{}
	var (
		name string
		n    int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { have[name] = n; return nil }); err != nil {
		return 0, false, false, fmt.Errorf("pgdedup: partitions: %w", err)
	}

	now := s.cfg.Now().UTC()
	today := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	parent := s.q.table
	var step string
	for name, n := range have {
		day, err := time.Parse(partitionLayout, strings.TrimPrefix(name, s.cfg.Table+"_p"))
		if err != nil || !strings.HasPrefix(name, s.cfg.Table+"_p") {
			continue // not one of ours
		}
		if !day.AddDate(0, 0, 1).Add(s.cfg.Retention).After(now) {
			step, dropped = `DROP TABLE `+pgx.Identifier{s.cfg.Schema, name}.Sanitize(), n
			break
		}
	}
	for d := 0; step == "" && d <= PartitionsAhead; d++ {
		day := today.AddDate(0, 0, d)
		name := s.partitionName(day)
		if _, ok := have[name]; ok {
			continue
		}
		// CREATE TABLE ... PARTITION OF would take the parent's exclusive
		// lock; ATTACH PARTITION takes a lock that claims do not conflict
		// with.
		p := pgx.Identifier{s.cfg.Schema, name}.Sanitize()
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
