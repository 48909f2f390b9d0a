-- idemq: the transactional outbox on SQLite (one relay at a time). Times are
-- Unix milliseconds. See the PostgreSQL migration for the columns.

-- +goose Up
CREATE TABLE IF NOT EXISTS idemq_outbox (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT    NOT NULL UNIQUE,
    source_key      TEXT,
    destination     TEXT    NOT NULL,
    partition_key   TEXT    NOT NULL DEFAULT '',
    headers         TEXT    NOT NULL DEFAULT '{}',
    body            BLOB    NOT NULL,
    created_at      INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    state           INTEGER NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at INTEGER,
    sent_at         INTEGER
);

CREATE INDEX IF NOT EXISTS idemq_outbox_pending_idx
    ON idemq_outbox (partition_key, seq) WHERE state = 0;

CREATE INDEX IF NOT EXISTS idemq_outbox_pending_seq_idx
    ON idemq_outbox (seq) WHERE state = 0;

CREATE INDEX IF NOT EXISTS idemq_outbox_source_key_idx
    ON idemq_outbox (source_key) WHERE source_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS idemq_outbox_sent_at_idx
    ON idemq_outbox (sent_at) WHERE state = 1;

-- +goose Down
DROP TABLE IF EXISTS idemq_outbox;
