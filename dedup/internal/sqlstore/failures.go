package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// FailuresSuffix ends the name of the handler-failure table of a store: the
// name of its processed-record table plus this suffix, in the same schema.
const FailuresSuffix = "_failures"

// Common holds the methods of dedupdriver.Common that the drivers of the
// SQL stores share: they embed it.
type Common struct{ s *Store }

// Common returns the methods of dedupdriver.Common on s.
func (s *Store) Common() Common { return Common{s} }

// RecordFailure implements dedupdriver.Common: one upsert, in its own
// implicit transaction on the store's DB (never in a handler's transaction,
// whose rollback would undo it; on SQLite it takes the write lock for one
// statement). The count expires Config.Retention after the last failure;
// an expired count, or one for another payload digest, starts again at 1,
// and Cleanup deletes expired counts.
func (c Common) RecordFailure(ctx context.Context, scope string, rec dedup.Record) (int, error) {
	s := c.s
	expires, now := "now() + $4::bigint * interval '1 microsecond'", "now()"
	args := []any{scope, rec.Key, rec.PayloadHash[:], s.retention.Microseconds()}
	if !s.postgres {
		us := time.Now().UnixMicro()
		expires, now = "?5", "?4"
		args = []any{scope, rec.Key, rec.PayloadHash[:], us, us + s.retention.Microseconds()}
	}
	query := `INSERT INTO ` + s.failures + ` AS f (scope, key, payload_hash, failures, expires_at)
VALUES (` + s.Ph(1) + `, ` + s.Ph(2) + `, ` + s.Ph(3) + `, 1, ` + expires + `)
ON CONFLICT (scope, key) DO UPDATE
SET failures = CASE WHEN f.expires_at <= ` + now + ` OR f.payload_hash <> EXCLUDED.payload_hash
        THEN 1 ELSE f.failures + 1 END,
    payload_hash = EXCLUDED.payload_hash,
    expires_at = EXCLUDED.expires_at
RETURNING failures`
	var n int
	if err := s.db.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: record failure of %q: %w", s.name, rec.Key, err)
	}
	return n, nil
}

// ForgetFailures implements dedupdriver.Common: it deletes the failure
// count of key in scope.
func (c Common) ForgetFailures(ctx context.Context, scope, key string) error {
	s := c.s
	if _, err := s.db.Exec(ctx, `DELETE FROM `+s.failures+` WHERE scope = `+s.Ph(1)+` AND key = `+s.Ph(2), scope, key); err != nil {
		return fmt.Errorf("%s: forget failures of %q: %w", s.name, key, err)
	}
	return nil
}

// Durability implements dedupdriver.Common: dedupdriver.ErrUnsupported
// (Caps.Durability is false). A PostgreSQL commit is durable, as is a SQLite
// one with synchronous=FULL (sqldedup.OpenSQLite), so there is nothing to
// report.
func (Common) Durability(context.Context) (dedup.Durability, error) {
	return dedup.Durability{}, dedupdriver.ErrUnsupported
}

// cleanupFailures deletes up to a batch of expired failure counts in one
// statement.
func (s *Store) cleanupFailures(ctx context.Context) (deleted int64, busy bool, err error) {
	query, args := cleanupQuery(s.postgres, s.failures, s.batch, time.Now())
	n, err := s.db.Exec(ctx, query, args...)
	return n, false, s.wrap("cleanup of failure counts", err)
}
