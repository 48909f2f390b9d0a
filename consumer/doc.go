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
// confirms, and what settles while an Ack is in flight leaves in the next
// Ack call. A lost or failed Ack is harmless: the message is redelivered and
// recognised.
//
// A redelivered message whose key is already recorded is acknowledged without
// running the handler. Two deliveries of one key at the same moment never run
// the handler twice: on the transactional path the second waits on the
// record's row lock for the first one's outcome; on the lease path it finds
// the lease held and is retried later.
//
// # Glossary
//
// Each word below has one meaning in idemq's code and documentation; other
// packages use these words and names, not synonyms.
//
//   - Message: one delivery from a broker, as a Source returns it
//     (Message). A Source is a broker adapter (sources/...).
//   - Key: the deduplication key of a message, what the store records.
//     Message.Key is the key the source found; the key function turns a
//     message into its key.
//   - Key function: Config.KeyFunc (DefaultKey unless set), and, one level
//     down, a source's own KeyFunc that reads Message.Key from the broker's
//     message (kafkasource.Config.KeyFunc). No other name is used for it.
//   - Scope: the namespace of the keys, Config.Name: two consumers with
//     different names never see each other's records.
//   - Record: the stored key (with its payload hash) that makes a later
//     delivery of the key a duplicate; on the transactional path it commits
//     with the handler's writes.
//   - Claim: asking the store for a key; its answer is a dedup.State (new,
//     done, mismatch, ...), the one name of a claim's result everywhere
//     (HookClaimed's ClaimInfo.State too: done is a duplicate). A lease is the lease path's claim: a
//     token-guarded, expiring hold on a key (dedupdriver.Lease), refreshed
//     while the handler runs, then completed (marked done) or abandoned
//     (dedupdriver.Lease.Abandon, after a failed effect). Release is a settle
//     (below), never something done to a lease.
//   - Duplicate: a delivery of a key that is already recorded with the same
//     payload. It is acknowledged without running the handler. The same
//     key with another payload is a mismatch (ErrPayloadMismatch), never a
//     duplicate.
//   - Attempt: one failed run of the handler for a message. Deliveries that
//     did not fail through the handler (a crash, a store outage, shutdown)
//     are not attempts, although Message.Attempt, the broker's count, may
//     rise with them.
//   - Settle: the one thing the runner does last with every received
//     message, through its Source. There are four settles, one meaning each:
//     Ack (Source.Ack): the effect is durable or the message is a duplicate;
//     the broker forgets it. Retry (Source.Retry): hand the message back for
//     a later delivery and count an attempt (the handler failed). Release
//     (Releaser.Release): hand the message back for a later delivery without
//     counting an attempt (it is not at fault: the store failed, another
//     worker holds its lease, an earlier message of its partition failed).
//     DeadLetter (Source.DeadLetter): move the message to the dead-letter
//     destination with its reason, then acknowledge it.
//   - Dead letter: a message moved to the dead-letter destination (a topic,
//     queue or exchange), with metadata.
//   - Metadata: the headers (Kafka, AMQP) or message attributes (SQS) a
//     dead letter carries, named by the Meta* constants of this package
//     (MetaReason, MetaAttempts, MetaKey, MetaDeadLetteredAt) and, for a
//     broker's own fields, by the Meta* constants of its source.
//   - Outage: a dependency (the broker's Receive or Ack, the store) failing
//     Config.OutageThreshold times in a row. Its failures are never
//     attempts; see Health.
//   - Timeout: the bound on one operation (HandlerTimeout, DrainTimeout, a
//     source's CommitTimeout, ConnectTimeout for establishing a broker
//     connection, ...). Every such bound is named ...Timeout; a
//     Wait (BatchWait) is time spent on purpose, not a bound.
//   - Stats: a counter is named after what it counts, with the same word in
//     the runner's Stats and in every source's: Received (messages
//     received), Retried (retries), Released (releases), DeadLettered (dead
//     letters), and ...Failures for failed calls.
//
// # Batches
//
// With Config.BatchSize above 1 (the default, 100), the transactional path
// handles a batch in one transaction without savepoints. A lane takes only
// what is already queued for it, so a lone message is a batch of one. TransactionalBatch gives one handler call
// the batch's new messages, for set-based writes. When a message fails, the
// transaction is rolled back and rerun without it (see Transactional): only
// the culprit's attempt is counted, the later messages of its PartitionKey in
// the batch wait for it (the earlier ones commit in the rerun), and no
// handler's writes commit twice.
//
// # Failures
//
// A handler error or panic rolls back the handler's writes and its record (or
// abandons its lease) and the message is retried with backoff
// (RetryPolicy) until RetryPolicy.MaxAttempts, then dead-lettered with the
// reason. Attempts are handler failures: when the path's store counts them
// (dedupdriver.Caps.FailureCount: pgdedup, sqldedup and redisdedup do), the runner
// counts each failure of a key there, after the failed transaction, and the
// count (not Message.Attempt, which also rises for every consumer that crashed
// while holding the message) decides the backoff and the dead letter. The
// count belongs to the key and its payload, and a successful dead letter
// forgets it, so that a replay of the dead letter starts afresh. If the
// count cannot be written, Message.Attempt decides and a warning is logged.
// Input that can never succeed goes to the dead-letter route at once:
// no key or a KeyFunc that panics (ErrMissingKey), a key with a control
// character, invalid UTF-8 or too long (ErrInvalidKey), an undecodable body
// (ErrMalformed), a body over
// Config.MaxMessageBytes (ErrOversized), the same key with a different payload
// (ErrPayloadMismatch), or a handler error wrapped with Permanent. Failures of
// the database or the broker are retried without counting against the
// message: the store's own begin, claim and commit, and the typed driver
// errors its driver classifies as transient (dedupdriver.Caps.Transient) (a deadlock, a serialization
// failure, a lost connection). Any other handler error, its HandlerTimeout
// deadline included, is a counted attempt; Permanent always wins. Nothing is
// acknowledged before its effect is durable: a failed commit (ErrCommit)
// acknowledges nothing.
//
// # Stopping
//
// Cancelling the context passed to Runner.Run stops receiving; messages already
// received are finished, committed and acknowledged within
// Config.DrainTimeout, and the rest return to the broker. Shutdown is never a
// message's failure: a handler cancelled because the drain timed out is
// neither counted as an attempt, retried nor dead-lettered; its message is
// left unacknowledged for the broker to redeliver.
//
// # Health
//
// Runner.Health reports whether the runner is running or draining, when it
// last received, and the consecutive failures of the broker's Receive and
// Ack and of the store, with a Ready verdict for readiness probes. After
// Config.OutageThreshold failures in a row of one dependency the runner logs
// one ERROR line naming it and the error (reminders at most every
// Config.OutageReminder), and one INFO line when it recovers; the WARN lines
// about single failures stop until the next reminder. While the store is
// down the runner receives nothing and probes the store instead. Whatever
// failed, the next attempt comes within 500 ms (a failed receive, the
// messages a store failure sent back, the store probe), so the runner goes
// on within about that once the dependency answers again, however long the
// outage lasted.
//
// # Hooks
//
// Config.Hooks observe a runner the way franz-go's hooks observe a client:
// each hook implements any of the small Hook* interfaces (HookReceived,
// HookClaimed, HookHandlerStart, HookSettled, ...), found once by type
// assertion in NewRunner, so adding an event never breaks a hook. Events:
// received, batch formed, claimed (new, or a duplicate with its
// DuplicateReason), handler start and end, commit, ack (HookAck: the
// messages, the call's timing and error), retry (by
// RetryKind), dead letter (by DeadLetterReason), lease lost, lease refresh
// failed, and settled, the last event of every received message; and, on
// the transactional path, one event per transaction (HookTx: its claim, a
// batch handler's call and its commit, with its messages' contexts). The
// context a HookReceived returns is the message's: later events get it, and
// the handler's context and the runner's log lines about the message see its
// values, so a span started there parents the handler's spans and a
// trace-aware slog handler can name the trace. consumer/otelidemq implements
// them with OpenTelemetry. A runner without hooks makes no call and no
// allocation for them. The batch API (TransactionalBatch) reports the same
// events as the per-message path, a handler start and end per message of a
// call included (except to a HookTx hook, which gets a call over more than
// one message once, in TxInfo). A source on a log-based broker may report its lag per
// partition (LagReporter; kafkasource does), which otelidemq exports.
//
// # Results
//
// A handler adapted with TxResult or Result (or their JSON variants)
// returns a result, which the runner stores with the key's record: in the
// same transaction on the transactional path, next to the done key on the
// lease path. A duplicate of the key gets it back instead of running the
// handler, and the source reads either through StoredResult before Ack
// (sources/httpsource answers HTTP requests with it). Results are bounded by
// Config.MaxResultBytes and kept for the record's retention.
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
// again. When Run starts it asks a source that implements HorizonReporter how
// late its broker may redeliver (SQS MessageRetentionPeriod, Kafka
// retention.ms, RabbitMQ x-message-ttl) and refuses with a *idemq.ConfigError when
// that is longer than the retention, unless Config.AllowShortRetention is
// set (then it warns once); a broker without a limit (a RabbitMQ queue
// without a TTL) gets one warning naming the fix.
package consumer
