package pgdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/pgpart"
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
	batch := func(ctx context.Context) (int64, bool, error) { // the records expired by the store's clock
		return s.shared.CleanupBatch(ctx, s.q.cleanup, s.cfg.CleanupBatchSize, s.cfg.Now())
	}
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

// Partition maintenance of a partitioned table (Config.Partitioned).
const (
	// PartitionsAhead is how many days after the clock's day (UTC) Cleanup
	// keeps a partition for, so that a janitor outage of that long stops
	// no claim.
	PartitionsAhead = pgpart.Ahead
	// PartitionLockTimeout bounds the wait of each partition's DDL for its
	// table lock (lock_timeout). A drop needs the table's exclusive lock,
	// which claims queue behind while it waits: the timeout bounds that
	// queue. A step that timed out is tried twice more within the Cleanup,
	// 50 to 250 ms apart, then by the next Cleanup.
	PartitionLockTimeout = pgpart.LockTimeout
)

// parts returns the partition maintenance of the store's table: a
// partition is dropped when its day ended at least Retention ago and it
// holds no unexpired record (stores of other scopes on the table may keep
// theirs longer).
//
// The check reads the partition through its BRIN index on expires_at
// (migration 005), which leaves out the block ranges whose records all
// expired: the sequential scan is turned off for the rest of the step's
// transaction (DDL alone follows), as the planner prefers it for a
// partition without statistics, expecting an early match. Without the
// index the check is still the scan that the first unexpired record ends.
func (s *Store) parts() *pgpart.Table {
	return &pgpart.Table{
		DB: s.db, Schema: s.cfg.Schema, Name: s.cfg.Table, LockKey: s.shared.LockKey(),
		Retention: s.cfg.Retention, Now: s.cfg.Now, Prefix: "pgdedup", Logger: s.cfg.Logger,
		Kept: func(ctx context.Context, tx pgx.Tx, partition string, now time.Time) (kept bool, err error) {
			if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
				return false, err
			}
			err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+partition+` WHERE expires_at > $1)`, now).Scan(&kept)
			return kept, err
		},
	}
}
