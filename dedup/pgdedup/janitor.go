package pgdedup

import (
	"context"
	"fmt"

	"github.com/idemq/idemq/dedup"
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
		parts := s.parts()
		p, err := parts.Partitioned(ctx, s.db)
		if err != nil {
			return 0, fmt.Errorf("pgdedup: cleanup: %w", err)
		}
		if p {
			batch = parts.Maintain
		}
	}
	return s.shared.Cleanup(ctx, s.cfg.CleanupPause, batch)
}

// cleanupBatch deletes, in its own transaction, a batch of expired records
// by the store's clock, unless another process holds the janitor's lock.
func (s *Store) cleanupBatch(ctx context.Context) (deleted int64, busy bool, err error) {
	return s.shared.CleanupBatch(ctx, s.q.cleanup, s.cfg.CleanupBatchSize, s.cfg.Now())
}

// RunJanitor calls Cleanup every Config.CleanupInterval until ctx is done,
// logging failures, and returns nil when ctx is done. Run it in its own
// goroutine in every worker process; the advisory lock keeps them from
// working at the same time. After a cleanup, at most once per
// Config.StatsInterval, it measures the table for TableStats.
func (s *Store) RunJanitor(ctx context.Context) error {
	return s.shared.RunJanitor(ctx, s.cfg.CleanupInterval, s.cfg.StatsInterval, s.cfg.Logger, s.Cleanup)
}

// TableStats returns the janitor's latest measurement of the table (see
// RunJanitor and Config.StatsInterval), and false before the first one. It
// does not touch the database.
func (s *Store) TableStats() (dedup.TableStats, bool) { return s.shared.TableStats() }

// Report reads the table's dedup.TableReport, sizes included, in two
// statements that scan the whole table. It returns the database's error
// (SQLSTATE 42P01) when the table does not exist.
func (s *Store) Report(ctx context.Context) (dedup.TableReport, error) { return s.shared.Report(ctx) }
