package sqlstore

import (
	"context"
	"log/slog"
	"time"
)

// cleanupPaced calls batch until it reports that another process is
// cleaning (busy), fails, or deletes fewer than size records, and returns
// how many records the calls deleted. Between two batches it pauses, so
// that a backlog is deleted at most size records per pause (fewer, by the
// batches' own time) and the cleaner leaves the database to the claims in
// between. A pause of 0 or less means none. When ctx is done during a
// pause, it returns the records deleted so far and ctx's error.
func cleanupPaced(ctx context.Context, size int, pause time.Duration, batch func(ctx context.Context) (deleted int64, busy bool, err error)) (int64, error) {
	var total int64
	for {
		n, busy, err := batch(ctx)
		total += n
		if err != nil || busy || n < int64(size) {
			return total, err
		}
		if pause > 0 {
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return total, ctx.Err()
			case <-t.C:
			}
		}
	}
}

// cleanupQuery returns the statement that deletes up to limit rows of the
// table t (quoted and qualified) that expired at now, and its arguments.
// On PostgreSQL the server's clock decides, and rows that a concurrent
// transaction locked are skipped; SQLite, which has one writer at a time,
// deletes the oldest first.
func cleanupQuery(postgres bool, t string, limit int, now time.Time) (string, []any) {
	if postgres {
		return `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
SELECT ctid FROM ` + t + ` WHERE expires_at <= now()
LIMIT $1 FOR UPDATE SKIP LOCKED))`, []any{limit}
	}
	return `DELETE FROM ` + t + ` WHERE (scope, key) IN (SELECT scope, key FROM ` + t +
		` WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)`, []any{now.UnixMicro(), limit}
}

// Cleanup deletes expired records with batch, then expired failure counts,
// each with cleanupPaced, and returns how many rows it deleted. A nil
// batch deletes the records that expired by the database's clock (see
// cleanupQuery), under the lock of CleanupBatch.
func (s *Store) Cleanup(ctx context.Context, pause time.Duration, batch func(ctx context.Context) (int64, bool, error)) (int64, error) {
	if batch == nil {
		batch = func(ctx context.Context) (int64, bool, error) {
			query, args := cleanupQuery(s.postgres, s.quoted, s.batch, time.Now())
			return s.CleanupBatch(ctx, query, args...)
		}
	}
	n, err := cleanupPaced(ctx, s.batch, pause, batch)
	if err != nil {
		return n, err
	}
	m, err := cleanupPaced(ctx, s.batch, pause, s.cleanupFailures)
	return n + m, err
}

// LockKey is the key of the janitor's advisory lock on PostgreSQL: one
// process cleans (or maintains the partitions of) a table at a time,
// whichever of the two stores it runs.
func (s *Store) LockKey() string { return "idemq.pgdedup.cleanup:" + s.quoted }

// CleanupBatch runs query, which deletes a batch of expired records, and
// returns how many it deleted. On PostgreSQL it runs in a transaction that
// first takes the advisory lock of LockKey, and reports busy, deleting
// nothing, when another process holds it.
func (s *Store) CleanupBatch(ctx context.Context, query string, args ...any) (deleted int64, busy bool, err error) {
	if !s.postgres {
		n, err := s.db.Exec(ctx, query, args...)
		return n, false, s.wrap("cleanup", err)
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return 0, false, s.wrap("cleanup", err)
	}
	defer tx.Rollback(ctx) // safe after commit
	var locked bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtext($1))`, s.LockKey()).Scan(&locked); err != nil {
		return 0, false, s.wrap("cleanup", err)
	}
	if !locked {
		return 0, true, nil
	}
	n, err := tx.Exec(ctx, query, args...)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return 0, false, s.wrap("cleanup", err)
	}
	return n, false, nil
}

// RunJanitor calls cleanup every interval until ctx is done and, after a
// cleanup, Measure at most once per measureEvery (after every cleanup when
// zero, never when negative). It logs failures and deletions to log with
// the store's name and ctx, and returns nil when ctx is done.
func (s *Store) RunJanitor(ctx context.Context, interval, measureEvery time.Duration, log *slog.Logger, cleanup func(ctx context.Context) (int64, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var measured time.Time
	for {
		n, err := cleanup(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			log.WarnContext(ctx, s.name+": cleanup failed", "err", err)
		case n > 0:
			log.DebugContext(ctx, s.name+": expired records deleted", "count", n)
		}
		if measureEvery >= 0 && (measured.IsZero() || time.Since(measured) >= measureEvery) {
			measured = time.Now()
			if err := s.Measure(ctx); err != nil && ctx.Err() == nil {
				log.WarnContext(ctx, s.name+": measuring the table failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
