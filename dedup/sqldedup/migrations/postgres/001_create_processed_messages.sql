-- idemq: the processed-message records of the transactional path.
-- Applied by sqldedup.Migrate (Postgres dialect) with the configured schema
-- and table name; usable as is from goose (or any tool that runs plain SQL)
-- for the default name. The table is the same as dedup/pgdedup's, so both
-- stores can share it.

-- +goose Up
CREATE TABLE IF NOT EXISTS processed_messages (
    scope        text        NOT NULL,
    key          text        NOT NULL,
    payload_hash bytea       NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX IF NOT EXISTS processed_messages_expires_at_idx
    ON processed_messages (expires_at);

-- +goose Down
DROP TABLE IF EXISTS processed_messages;
