-- idemq: the result a handler returned, stored with its record (see
-- dedup.ResultStorer), shared by dedup/pgdedup and dedup/sqldedup. The
-- column is nullable without a default, so adding it rewrites nothing, and a
-- record without a result stores a NULL, which costs no bytes beyond the
-- row's null bitmap. Rendered like 001 for the configured schema and table.

-- +goose Up
ALTER TABLE processed_messages ADD COLUMN IF NOT EXISTS result bytea;

-- +goose Down
ALTER TABLE processed_messages DROP COLUMN IF EXISTS result;
