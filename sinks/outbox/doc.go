// Package outbox is a transactional outbox: a handler publishes messages in
// its own database transaction, and a Relay sends them to Kafka, SQS or
// RabbitMQ (through kafkaoutbox, sqsoutbox or amqpoutbox) after the
// transaction commits.
//
// Publish writes a row in the caller's pgx transaction (PublishSQL: a
// database/sql one, on PostgreSQL or SQLite). If the transaction rolls
// back, nothing is published; if it commits, the relay publishes the
// message at least once with a stable id as its idempotency key, and marks
// it sent only after the broker confirmed it. A relay that crashes between
// the confirmation and the update publishes the row again: the duplicate
// window is at the downstream consumer, which absorbs it by the stable id.
// Reply and Resender answer requests through the outbox.
//
// The table comes from dedup/migrate's Outbox line (or `idemq migrate
// --outbox`). docs/outbox.md is the guide: stable ids, schemas, routing
// keys, batch handlers, request/reply, ordering, retries and partitioning.
package outbox
