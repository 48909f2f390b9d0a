-- idemq: handler-failure counts per key (dedup.FailureCounter), shared by
-- dedup/pgdedup and dedup/sqldedup. A row is written only when a handler
-- fails, in its own statement after the failed transaction rolled back, so
-- it costs nothing on the happy path; it expires with the store's retention
-- after its last failure and the janitor deletes it. payload_hash is the
-- digest the count belongs to: a failure with another payload starts again
-- at 1. Rendered like 001 for the configured schema and table (the table
-- name gets the suffix "_failures").

-- +goose Up
CREATE TABLE IF NOT EXISTS processed_messages_failures (
    scope        text        NOT NULL,
    key          text        NOT NULL,
    payload_hash bytea       NOT NULL,
    failures     integer     NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX IF NOT EXISTS processed_messages_failures_expires_at_idx
    ON processed_messages_failures (expires_at);

-- +goose Down
DROP TABLE IF EXISTS processed_messages_failures;
