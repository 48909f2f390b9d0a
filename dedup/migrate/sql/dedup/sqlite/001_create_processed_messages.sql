-- idemq: the processed-message records of the transactional path.
-- Applied by sqldedup.Migrate (SQLite dialect) with the configured table
-- name; usable as is from goose (or any tool that runs plain SQL) for the
-- default name. Times are Unix microseconds (UTC).

-- +goose Up
CREATE TABLE IF NOT EXISTS processed_messages (
    scope        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    payload_hash BLOB    NOT NULL,
    processed_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) STRICT, WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS processed_messages_expires_at_idx
    ON processed_messages (expires_at);

-- +goose Down
DROP TABLE IF EXISTS processed_messages;
