package pgdedup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// failuresTable is the quoted, schema-qualified handler-failure table: the
// configured table name plus "_failures" (created by migration 002).
func (s *Store) failuresTable() string {
	return pgx.Identifier{s.cfg.Schema, s.cfg.Table + sqlstore.FailuresSuffix}.Sanitize()
}

// RecordFailure implements dedupdriver.Common: one upsert, in its own
// implicit transaction on the store's DB (never in a handler's transaction,
// whose rollback would undo it). The count expires Config.Retention after
// the last failure; an expired count starts again at 1, and Cleanup deletes
// expired counts.
func (s txDriver) RecordFailure(ctx context.Context, scope string, rec dedup.Record) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, sqlstore.PostgresRecordFailure(s.failuresTable()),
		scope, rec.Key, rec.PayloadHash[:], s.cfg.Retention.Microseconds()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("pgdedup: record failure of %q: %w", rec.Key, err)
	}
	return n, nil
}

// ForgetFailures implements dedupdriver.Common: it deletes the failure
// count of key in scope.
func (s txDriver) ForgetFailures(ctx context.Context, scope, key string) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM `+s.failuresTable()+` WHERE scope = $1 AND key = $2`, scope, key); err != nil {
		return fmt.Errorf("pgdedup: forget failures of %q: %w", key, err)
	}
	return nil
}

// cleanupFailuresBatch deletes up to CleanupBatchSize expired failure counts.
func (s *Store) cleanupFailuresBatch(ctx context.Context) (deleted int64, busy bool, err error) {
	tag, err := s.db.Exec(ctx, sqlstore.PostgresCleanupFailures(s.failuresTable()), s.cfg.CleanupBatchSize)
	if err != nil {
		return 0, false, fmt.Errorf("pgdedup: cleanup of failure counts: %w", err)
	}
	return tag.RowsAffected(), false, nil
}
