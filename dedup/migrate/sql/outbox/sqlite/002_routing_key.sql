-- idemq: the RabbitMQ routing key of a row when it differs from its
-- partition key (outbox.Message.RoutingKey); '' routes with partition_key.
-- SQLite has no ADD COLUMN IF NOT EXISTS: outbox.MigrateSQL skips this
-- statement when the column exists; a plain SQL tool runs it once.

-- +goose Up
ALTER TABLE idemq_outbox ADD COLUMN routing_key TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE idemq_outbox DROP COLUMN routing_key;
