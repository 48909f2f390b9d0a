package sqldedup

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// failuresTable is the quoted handler-failure table (schema-qualified on
// PostgreSQL): the configured table name plus "_failures", created by
// migration 002.
func (s *Store) failuresTable() string {
	t := quoteIdent(s.cfg.Table + sqlstore.FailuresSuffix)
	if s.cfg.Dialect == Postgres {
		t = quoteIdent(s.cfg.Schema) + "." + t
	}
	return t
}

// RecordFailure implements dedupdriver.Common: one upsert, in its own
// implicit transaction on the store's DB (never in a handler's transaction,
// whose rollback would undo it). The count expires Config.Retention after
// the last failure; an expired count starts again at 1, and Cleanup deletes
// expired counts. On SQLite it takes the write lock for one statement.
func (s txDriver) RecordFailure(ctx context.Context, scope string, rec dedup.Record) (int, error) {
	query := sqlstore.PostgresRecordFailure(s.failuresTable())
	args := []any{scope, rec.Key, rec.PayloadHash[:], s.cfg.Retention.Microseconds()}
	if s.cfg.Dialect != Postgres {
		now := time.Now().UnixMicro()
		query = `INSERT INTO ` + s.failuresTable() + ` (scope, key, payload_hash, failures, expires_at)
VALUES (?1, ?2, ?3, 1, ?5)
ON CONFLICT (scope, key) DO UPDATE
SET failures = CASE WHEN expires_at <= ?4 OR payload_hash <> excluded.payload_hash
        THEN 1 ELSE failures + 1 END,
    payload_hash = excluded.payload_hash,
    expires_at = excluded.expires_at
RETURNING failures`
		args = []any{scope, rec.Key, rec.PayloadHash[:], now, now + s.cfg.Retention.Microseconds()}
	}
	var n int
	if err := s.db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("sqldedup: record failure of %q: %w", rec.Key, err)
	}
	return n, nil
}

// ForgetFailures implements dedupdriver.Common: it deletes the failure
// count of key in scope.
func (s txDriver) ForgetFailures(ctx context.Context, scope, key string) error {
	query := `DELETE FROM ` + s.failuresTable() + ` WHERE scope = ` + s.q.ph(1) + ` AND key = ` + s.q.ph(2)
	if _, err := s.db.ExecContext(ctx, query, scope, key); err != nil {
		return fmt.Errorf("sqldedup: forget failures of %q: %w", key, err)
	}
	return nil
}

// cleanupFailuresBatch deletes up to CleanupBatchSize expired failure counts
// in one statement (on PostgreSQL skipping rows a concurrent failure is
// updating).
func (s *Store) cleanupFailuresBatch(ctx context.Context) (deleted int64, busy bool, err error) {
	t := s.failuresTable()
	query, args := sqlstore.PostgresCleanupFailures(t), []any{s.cfg.CleanupBatchSize}
	if s.cfg.Dialect != Postgres {
		query = `DELETE FROM ` + t + ` WHERE (scope, key) IN (SELECT scope, key FROM ` + t +
			` WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)`
		args = []any{time.Now().UnixMicro(), s.cfg.CleanupBatchSize}
	}
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, false, fmt.Errorf("sqldedup: cleanup of failure counts: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, false, fmt.Errorf("sqldedup: cleanup of failure counts: %w", err)
	}
	return n, false, nil
}
