-- idemq: the processed-message records of the transactional path on
-- PostgreSQL, shared by dedup/pgdedup and dedup/sqldedup (so both stores can
-- use one table). Their Migrate renders it for the configured schema and
-- table; it is usable as is from goose (or any tool that runs plain SQL) for
-- the default name.
--
-- The expiry index is a BRIN index: records are inserted in expiry order, so
-- it stays small and costs next to nothing per insert, and the janitor only
-- needs "some expired rows", not an ordered scan.

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
    ON processed_messages USING brin (expires_at);

-- +goose Down
DROP TABLE IF EXISTS processed_messages;
