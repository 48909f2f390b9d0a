// Package consumer runs message-queue workers whose effects happen exactly
// once, although every broker delivers at least once.
//
// A worker is one handler function and a Source (a broker adapter from
// sources/...). The Runner receives messages, and for each one:
//
//   - on the transactional path (Transactional, with a store such as
//     dedup/pgdedup), records the message's key in the same database
//     transaction as the handler's writes, commits, and only then
//     acknowledges;
//   - on the lease path (Leased, with a store such as
//     dedup/redisdedup), claims the key with a token-guarded lease, runs the
//     handler while refreshing the lease, marks the key done, and only then
//     acknowledges.
//
// Each lane acknowledges in the background, in order: it hands its settled
// messages to its acker and goes on to the next batch while the broker
// confirms. A lost or failed Ack is harmless: the message is redelivered and
// recognised.
//
// A redelivered message whose key is already recorded is acknowledged without
// running the handler. Two deliveries of one key at the same moment never run
// the handler twice: on the transactional path the second waits on the
// record's row lock for the first one's outcome; on the lease path it finds
// the lease held and is retried later.
//
// The words of this package (message, key, record, claim, duplicate,
// attempt, settle, outage, ...) have one meaning each, given in
// docs/glossary.md; what each path promises, and how bad input and outages
// are routed, is in docs/guarantees.md.
//
// # Batches
//
// With Config.BatchSize above 1 (the default, 100), the transactional path
// handles what is queued for a lane in one transaction without savepoints;
// TransactionalBatch gives one handler call the batch's new messages. When a
// message fails, the transaction is rolled back and rerun without it (see
// Transactional): only the culprit's attempt is counted, and no handler's
// writes commit twice.
//
// # Failures
//
// A handler error or panic rolls back the handler's writes and its record (or
// abandons its lease) and the message is retried with backoff (RetryPolicy)
// until RetryPolicy.MaxAttempts handler failures, then dead-lettered with the
// reason (DeadLetterError). Input that can never succeed is dead-lettered at
// once (IsPermanent). Failures of the database or the broker are retried
// without counting against the message. Nothing is acknowledged before its
// effect is durable: a failed commit (ErrCommit) acknowledges nothing.
//
// # Stopping
//
// Cancelling the context passed to Runner.Run stops receiving; messages already
// received are finished, committed and acknowledged within
// Config.DrainTimeout, and the rest return to the broker. Shutdown is never a
// message's failure: a handler cancelled because the drain timed out is
// neither counted as an attempt, retried nor dead-lettered.
//
// # Observing
//
// Runner.Health reports the runner's dependencies for readiness probes
// (HealthHandler serves them), and Runner.Stats its counters. Config.Hooks
// observe every event of a message (see Hook); consumer/otelidemq implements
// them with OpenTelemetry (docs/observability.md).
//
// # Results
//
// A handler adapted with TxResult or Result returns a result, which the
// runner stores with the key's record; a duplicate of the key gets it back
// (StoredResult) instead of running the handler.
//
// # Remaining duplicate window
//
// The transactional path has none. The lease path has one: a crash after the
// effect and before the key is marked done repeats the effect once the lease
// expires. Forward IdempotencyKey(ctx) to the downstream system as an idempotency
// key to close it.
//
// # Retention
//
// A record is remembered for the store's retention (dedup.DefaultRetention,
// 8 days, unless configured): a redelivery later than that runs the handler
// again. Run refuses to start when the source's broker may redeliver later
// than that (see HorizonReporter and Config.AllowShortRetention).
package consumer
