package sqlstore

// FailuresSuffix ends the name of the handler-failure table of a store: the
// name of its processed-record table plus this suffix, in the same schema.
const FailuresSuffix = "_failures"

// PostgresRecordFailure returns the statement that adds one handler failure
// to ($1 scope, $2 key) with payload digest $3 in the failure table t (quoted
// and qualified), with an expiry of now + $4 microseconds, and returns the
// count. An expired count, or one for another payload digest, starts again
// at 1.
func PostgresRecordFailure(t string) string {
	return `INSERT INTO ` + t + ` AS f (scope, key, payload_hash, failures, expires_at)
VALUES ($1, $2, $3, 1, now() + $4::bigint * interval '1 microsecond')
ON CONFLICT (scope, key) DO UPDATE
SET failures = CASE WHEN f.expires_at <= now() OR f.payload_hash <> EXCLUDED.payload_hash
        THEN 1 ELSE f.failures + 1 END,
    payload_hash = EXCLUDED.payload_hash,
    expires_at = EXCLUDED.expires_at
RETURNING failures`
}

// PostgresCleanupFailures returns the statement that deletes up to $1
// expired rows of the failure table t, skipping rows a concurrent failure is
// updating.
func PostgresCleanupFailures(t string) string {
	return `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
SELECT ctid FROM ` + t + ` WHERE expires_at <= now()
LIMIT $1 FOR UPDATE SKIP LOCKED))`
}
