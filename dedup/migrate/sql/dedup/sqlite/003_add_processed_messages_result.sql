-- idemq: the result a handler returned, stored with its record (see
-- dedup.ResultStorer). Nullable: a record without a result stores a NULL,
-- one byte of the record's header. Applied by sqldedup.Migrate (SQLite
-- dialect) with the configured table name.

-- +goose Up
ALTER TABLE processed_messages ADD COLUMN result BLOB;

-- +goose Down
ALTER TABLE processed_messages DROP COLUMN result;
