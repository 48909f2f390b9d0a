-- idemq: the RabbitMQ routing key of a row when it differs from its
-- partition key (outbox.Message.RoutingKey); '' routes with partition_key.

-- +goose Up
ALTER TABLE idemq_outbox ADD COLUMN IF NOT EXISTS routing_key text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE idemq_outbox DROP COLUMN IF EXISTS routing_key;
