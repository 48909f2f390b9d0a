// Package outbox is a transactional outbox: a handler publishes messages in
// its own database transaction, and a Relay sends them to Kafka, SQS or
// RabbitMQ after the transaction commits.
//
// Publish inserts a row into the idemq_outbox table in the caller's
// transaction (a pgx.Tx; PublishSQL takes a *sql.Tx, on PostgreSQL or
// SQLite; a wrong type does not compile). If the transaction
// rolls back, nothing is published; if it commits, the relay publishes the
// message at least once, with a stable id as its idempotency key. Inside a
// consumer handler the id is derived from the consuming message's
// idempotency key and the publish's index, so a rerun after a rollback
// publishes the same ids, and an idemq consumer downstream deduplicates the
// relay's re-sends; a batch handler passes msg.KeyContext(ctx) for each of
// its messages. Message.Key orders the relay; Message.RoutingKey, when set,
// is the RabbitMQ routing key instead of Key. Schema names the table's
// PostgreSQL schema (by default it is found through search_path); its
// methods are the package-level functions in that schema, and
// Config.Schema points a relay at it.
//
// The relay claims committed rows, publishes them through a Publisher
// (kafkaoutbox, sqsoutbox, amqpoutbox), waits for the broker's
// confirmation, and only then marks the rows sent. A relay that crashes
// between the confirmation and the update publishes the rows again: the
// duplicate window is at the downstream consumer, which absorbs it by the
// stable id. See Relay for ordering, concurrency, retries and retention, and
// Hook for its observers (consumer/otelidemq's RelayHook exports its
// metrics). Publish stores the handler span's trace context in the row's
// headers, so the published message continues the handler's trace.
//
// The outbox table's migrations are those of dedup/migrate's Outbox line:
// migrate.NewPgx (or NewSQL) with Config{Line: migrate.Outbox}, and
// `idemq migrate --outbox [--schema S] [--print|--status]`.
package outbox
