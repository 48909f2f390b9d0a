package sqldedup

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
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
	n, err := sqlstore.Cleanup(ctx, s.cfg.CleanupBatchSize, s.cleanupBatch)
	if err != nil {
		return n, err
	}
	m, err := sqlstore.Cleanup(ctx, s.cfg.CleanupBatchSize, s.cleanupFailuresBatch)
	return n + m, err
}

func (s *Store) cleanupBatch(ctx context.Context) (deleted int64, busy bool, err error) {
	query, args := s.q.cleanup(s.cfg.CleanupBatchSize, time.Now())
	if s.cfg.Dialect != Postgres {
		res, err := s.db.ExecContext(ctx, query, args...)
		if err != nil {
			return 0, false, fmt.Errorf("sqldedup: cleanup: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, false, fmt.Errorf("sqldedup: cleanup: %w", err)
		}
		return n, false, nil
	}

	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, fmt.Errorf("sqldedup: cleanup: %w", err)
	}
	defer tx.Rollback() // safe after commit
	var locked bool
	lockKey := "idemq.pgdedup.cleanup:" + s.q.table
	if err := tx.QueryRowContext(ctx, `SELECT pg_try_advisory_xact_lock(hashtext($1))`, lockKey).Scan(&locked); err != nil {
		return 0, false, fmt.Errorf("sqldedup: cleanup: %w", err)
	}
	if !locked {
		return 0, true, nil
	}
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, false, fmt.Errorf("sqldedup: cleanup: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, false, fmt.Errorf("sqldedup: cleanup: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, false, fmt.Errorf("sqldedup: cleanup: %w", err)
	}
	return n, false, nil
}

// RunJanitor calls Cleanup every Config.CleanupInterval until ctx is done,
// logging failures, and returns nil when ctx is done. Run it in its own
// goroutine in every worker process; on PostgreSQL an advisory lock keeps
// them from working at the same time. After a cleanup, at most once per
// Config.StatsInterval, it measures the table for TableStats.
func (s *Store) RunJanitor(ctx context.Context) error {
	return sqlstore.RunJanitor(ctx, sqlstore.Janitor{Interval: s.cfg.CleanupInterval, Log: s.cfg.Logger, Store: "sqldedup",
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
	rows, err := s.db.QueryContext(ctx, "SELECT scope, count(*), min("+s.q.micros("processed_at")+") FROM "+s.q.table+" GROUP BY scope ORDER BY scope")
	if err != nil {
		return fmt.Errorf("sqldedup: measure the table: %w", err)
	}
	defer rows.Close()
	err = s.stats.Collect(rows, func(sc *dedup.ScopeStats) error {
		var oldest int64
		if err := rows.Scan(&sc.Scope, &sc.Records, &oldest); err != nil {
			return err
		}
		sc.Oldest = time.UnixMicro(oldest)
		return nil
	})
	if err != nil {
		return fmt.Errorf("sqldedup: measure the table: %w", err)
	}
	return nil
}
