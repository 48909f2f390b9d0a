-- idemq: handler-failure counts per key (dedup.FailureCounter). A row is
-- written only when a handler fails, after the failed transaction rolled
-- back; it expires with the store's retention after its last failure and the
-- janitor deletes it. payload_hash is the digest the count belongs to: a
-- failure with another payload starts again at 1. Times are Unix
-- microseconds (UTC).

-- +goose Up
CREATE TABLE IF NOT EXISTS processed_messages_failures (
    scope        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    payload_hash BLOB    NOT NULL,
    failures     INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) STRICT, WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS processed_messages_failures_expires_at_idx
    ON processed_messages_failures (expires_at);

-- +goose Down
DROP TABLE IF EXISTS processed_messages_failures;
