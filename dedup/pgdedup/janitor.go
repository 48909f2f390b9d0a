package pgdedup

import (
	"context"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// Cleanup deletes expired records in batches of Config.CleanupBatchSize, each
// in its own short transaction and Config.CleanupPause after the previous
// one, until none is left, and returns how many it deleted. Rows locked by a
// concurrent claim are skipped, so cleanup never blocks consumption. When another process is cleaning the same table, this
// call returns at once (an advisory lock lets one cleaner run at a time).
// Expired handler-failure counts (see RecordFailure) are deleted the same
// way, after the records.
//
// On a partitioned table (Config.Partitioned) it creates and drops
// partitions instead (see PartitionsAhead and PartitionLockTimeout), and
// counts the records of the partitions dropped as the planner's statistics
// estimate them.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	batch := s.cleanupBatch
	if s.cfg.Partitioned {
		p, err := s.partitioned(ctx, s.db)
		if err != nil {
			return 0, fmt.Errorf("pgdedup: cleanup: %w", err)
		}
		if p {
			batch = s.maintainPartitions
		}
	}
	n, err := sqlstore.CleanupPaced(ctx, s.cfg.CleanupBatchSize, s.cfg.CleanupPause, batch)
	if err != nil {
		return n, err
	}
	m, err := sqlstore.CleanupPaced(ctx, s.cfg.CleanupBatchSize, s.cfg.CleanupPause, s.cleanupFailuresBatch)
	return n + m, err
}

func (s *Store) cleanupBatch(ctx context.Context) (deleted int64, busy bool, err error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("pgdedup: cleanup: %w", err)
	}
	defer tx.Rollback(ctx) // safe after commit
	var locked bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtext($1))`, s.lockKey()).Scan(&locked); err != nil {
		return 0, false, fmt.Errorf("pgdedup: cleanup: %w", err)
	}
	if !locked {
		return 0, true, nil
	}
	tag, err := tx.Exec(ctx, s.q.cleanup, s.cfg.CleanupBatchSize, s.cfg.Now())
	if err != nil {
		return 0, false, fmt.Errorf("pgdedup: cleanup: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("pgdedup: cleanup: %w", err)
	}
	return tag.RowsAffected(), false, nil
}

// lockKey is the key of the janitor's advisory lock: one process cleans
// (or maintains the partitions of) a table at a time.
func (s *Store) lockKey() string { return "idemq.pgdedup.cleanup:" + s.q.table }

// RunJanitor calls Cleanup every Config.CleanupInterval until ctx is done,
// logging failures, and returns nil when ctx is done. Run it in its own
// goroutine in every worker process; the advisory lock keeps them from
// working at the same time. After a cleanup, at most once per
// Config.StatsInterval, it measures the table for TableStats.
func (s *Store) RunJanitor(ctx context.Context) error {
	return sqlstore.RunJanitor(ctx, sqlstore.Janitor{Interval: s.cfg.CleanupInterval, Log: s.cfg.Logger, Store: "pgdedup",
		Cleanup: s.Cleanup, Measure: s.measure, MeasureEvery: s.cfg.StatsInterval})
}

// TableStats returns the janitor's latest measurement of the table (see
// RunJanitor and Config.StatsInterval), and false before the first one. It
// does not touch the database.
func (s *Store) TableStats() (dedup.TableStats, bool) {
	return s.stats.Get()
}

// measure counts the table's records per scope and finds each scope's
// oldest, for TableStats.
func (s *Store) measure(ctx context.Context) error {
	rows, err := s.db.Query(ctx, `SELECT scope, count(*), min(processed_at) FROM `+s.q.table+` GROUP BY scope ORDER BY scope`)
	if err != nil {
		return fmt.Errorf("pgdedup: measure the table: %w", err)
	}
	defer rows.Close()
	err = s.stats.Collect(rows, func(sc *dedup.ScopeStats) error { return rows.Scan(&sc.Scope, &sc.Records, &sc.Oldest) })
	if err != nil {
		return fmt.Errorf("pgdedup: measure the table: %w", err)
	}
	return nil
}
