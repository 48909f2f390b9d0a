-- idemq: the transactional outbox on PostgreSQL. outbox.Publish inserts a
-- row in the handler's transaction; outbox.Relay publishes committed rows to
-- the broker and marks them sent (state 1) or parks them (state 2) after too
-- many failed attempts. Usable as is from goose or any tool that runs plain
-- SQL.
--
-- seq orders the rows of one partition key; id is the stable message id the
-- relay sends as the idempotency key; source_key is the idempotency key of
-- the consuming message whose handler published the row (NULL for an
-- explicit id), used to number its publishes.

-- +goose Up
CREATE TABLE IF NOT EXISTS idemq_outbox (
    seq             bigserial   PRIMARY KEY,
    id              text        NOT NULL UNIQUE,
    source_key      text,
    destination     text        NOT NULL,
    partition_key   text        NOT NULL DEFAULT '',
    headers         text        NOT NULL DEFAULT '{}',
    body            bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    state           smallint    NOT NULL DEFAULT 0,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz,
    sent_at         timestamptz
);

CREATE INDEX IF NOT EXISTS idemq_outbox_pending_idx
    ON idemq_outbox (partition_key, seq) WHERE state = 0;

CREATE INDEX IF NOT EXISTS idemq_outbox_pending_seq_idx
    ON idemq_outbox (seq) WHERE state = 0;

CREATE INDEX IF NOT EXISTS idemq_outbox_source_key_idx
    ON idemq_outbox (source_key) WHERE source_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS idemq_outbox_sent_at_idx
    ON idemq_outbox (sent_at) WHERE state = 1;

CREATE OR REPLACE FUNCTION idemq_outbox_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idemq_outbox', '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS idemq_outbox_notify ON idemq_outbox;
CREATE TRIGGER idemq_outbox_notify AFTER INSERT ON idemq_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION idemq_outbox_notify();

-- +goose Down
DROP TABLE IF EXISTS idemq_outbox;
DROP FUNCTION IF EXISTS idemq_outbox_notify();
