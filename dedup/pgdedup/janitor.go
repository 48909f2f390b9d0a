package pgdedup

import (
	"context"
	"fmt"
	"time"
)

// Cleanup deletes expired records in batches of Config.CleanupBatchSize, each
// in its own short transaction, until none is left, and returns how many it
// deleted. Rows locked by a concurrent claim are skipped, so cleanup never
// blocks consumption. When another process is cleaning the same table, this
// call returns at once (an advisory lock lets one cleaner run at a time).
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		n, busy, err := s.cleanupBatch(ctx)
		total += n
		if err != nil || busy || n < int64(s.cfg.CleanupBatchSize) {
			return total, err
		}
	}
}

func (s *Store) cleanupBatch(ctx context.Context) (deleted int64, busy bool, err error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("pgdedup: cleanup: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // safe after commit
	var locked bool
	lockKey := "idemq.pgdedup.cleanup:" + s.q.table
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtext($1))`, lockKey).Scan(&locked); err != nil {
		return 0, false, fmt.Errorf("pgdedup: cleanup: %w", err)
	}
	if !locked {
		return 0, true, nil
	}
	tag, err := tx.Exec(ctx, s.q.cleanup, s.cfg.CleanupBatchSize)
	if err != nil {
		return 0, false, fmt.Errorf("pgdedup: cleanup: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("pgdedup: cleanup: %w", err)
	}
	return tag.RowsAffected(), false, nil
}

// RunJanitor calls Cleanup every Config.CleanupInterval until ctx is done,
// logging failures, and returns nil when ctx is done. Run it in its own
// goroutine in every worker process; the advisory lock keeps them from
// working at the same time.
func (s *Store) RunJanitor(ctx context.Context) error {
	t := time.NewTicker(s.cfg.CleanupInterval)
	defer t.Stop()
	for {
		n, err := s.Cleanup(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			s.cfg.Logger.Warn("pgdedup: cleanup failed", "err", err)
		case n > 0:
			s.cfg.Logger.Debug("pgdedup: expired records deleted", "count", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
