package sqldedup

import (
	"context"

	"github.com/idemq/idemq/dedup"
)

// Cleanup deletes expired records in batches of Config.CleanupBatchSize, each
// in its own short transaction, until none is left, and returns how many it
// deleted. On PostgreSQL, rows locked by a concurrent claim are skipped, so
// cleanup never blocks consumption, and when another process is cleaning the
// same table this call returns at once (an advisory lock lets one cleaner run
// at a time). On SQLite each batch holds the write lock for one short
// statement; claims wait for it through the busy timeout. Expired
// handler-failure counts (see RecordFailure) are deleted the same way, after
// the records.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	return s.shared.Cleanup(ctx, 0, nil)
}

// RunJanitor calls Cleanup every Config.CleanupInterval until ctx is done,
// logging failures, and returns nil when ctx is done. Run it in its own
// goroutine in every worker process; on PostgreSQL an advisory lock keeps
// them from working at the same time. After a cleanup, at most once per
// Config.StatsInterval, it measures the table for TableStats.
func (s *Store) RunJanitor(ctx context.Context) error {
	return s.shared.RunJanitor(ctx, s.cfg.CleanupInterval, s.cfg.StatsInterval, s.cfg.Logger, s.Cleanup)
}

// TableStats returns the janitor's latest measurement of the table (see
// RunJanitor and Config.StatsInterval), and false before the first one. It
// does not touch the database.
func (s *Store) TableStats() (dedup.TableStats, bool) { return s.shared.TableStats() }

// Report reads the table's dedup.TableReport in statements that scan the
// whole table; on SQLite the sizes are known only where the driver has the
// dbstat table. It returns the database's error when the table does not
// exist.
func (s *Store) Report(ctx context.Context) (dedup.TableReport, error) { return s.shared.Report(ctx) }
