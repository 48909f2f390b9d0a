// Package pgdedup is the PostgreSQL store of idemq's transactional path
// (github.com/jackc/pgx/v5). Its driver implements dedupdriver.Tx[pgx.Tx],
// so a handler receives the pgx.Tx that also records its message:
//
//	store, err := pgdedup.New(pool, pgdedup.Config{})
//	...
//	runner, err := consumer.NewRunner(src, consumer.Transactional(store, handle), consumer.Config{Name: "billing"})
//
// # Guarantees
//
// A message's record (scope, key, payload hash, processed and expiry time) is
// inserted in the same transaction as the handler's writes: both commit or
// neither does, and a message is acknowledged only after the commit. The
// primary key (scope, key) makes a concurrent claim of the same key wait on
// the first transaction and then see its outcome, so the handler never runs
// twice for one key. Keys of a batch are inserted in ascending order, so
// concurrent batches cannot deadlock on records (handlers that lock business
// rows in different orders can still deadlock; PostgreSQL aborts one
// transaction and its messages are retried). A key is looked up through the
// primary key index: the cost of a duplicate check does not grow with the
// table.
//
// Use the default READ COMMITTED isolation: a claim must see the commit it
// waited for.
//
// # Partitioned table
//
// With Config.Partitioned the table is partitioned by day (UTC) of
// processed_at (dedup/migrate's migration 004), and the janitor drops a
// day's partition instead of deleting rows. PostgreSQL enforces a unique
// key only within a partition, so the claim does it: it takes a
// transaction-scoped advisory lock per key (in one order), then, in a later
// statement whose snapshot sees every commit the lock waited for, inserts
// the keys that no partition holds. A redelivery on a later day, two claims
// on either side of midnight, a stored result and a payload mismatch in an
// older partition are found as in one table. Its statements are planned
// for their arguments each time, never from a cached generic plan, which
// would read a day's partition whole once the day fills it if it was made
// while the partition was empty. The clock that dates a record,
// and so chooses its partition, is Config.Now. docs/operations.md has the
// measurements and the migration of an existing table.
//
// # Round trips
//
// With a *pgxpool.Pool or a *pgx.Conn, BeginClaim sends BEGIN and the claim's
// insert in one pipelined round trip (pgx.Batch.BeginTx). CommitChain sends
// COMMIT AND CHAIN and the next batch's claim in one round trip on the same
// connection: the Runner uses it when a lane's next batch is already queued,
// so a busy lane at batch size 1 costs two round trips per message (the
// commit with the next claim, the handler's statement), and an idle one
// three (BEGIN and claim, the handler's statement, COMMIT). The results
// handlers return (StoreResults) are written by a statement pipelined with
// COMMIT AND CHAIN when the runner chains transactions (no round trip of
// their own), or sent just before a plain COMMIT (one).
// A batch takes no savepoints (see dedupdriver.Tx), so it
// takes one transaction ID however many messages it holds. Commit reports a
// commit the database refused for the transaction's content with
// dedup.ErrTxRefused, and IsAborted recognises the statements refused after
// an earlier failure (SQLSTATE 25P02), so that the runner can find the
// message at fault.
//
// # Retention
//
// Records expire after Config.Retention (8 days by default, above the default
// retention of SQS queues and Kafka topics; the store reports it to the
// Runner, which refuses to start when its source's broker keeps messages
// longer). An expired record no longer deduplicates; RunJanitor drops the
// partitions whose records all expired (Config.Partitioned), or deletes expired records in small
// batches, skipping rows that are locked, under an advisory lock so that one
// process cleans at a time, with a pause (Config.CleanupPause) between two
// batches so that a backlog does not starve the claims. Every
// Config.StatsInterval (5 min) it also measures the table after its cleanup
// (records per scope, the oldest record), which Store.TableStats returns
// without a query and otelidemq's Hook.ObserveDedup exports as gauges.
//
// # Handler failures
//
// The store counts handler failures (dedupdriver.Caps.FailureCount): when a handler fails, the runner
// counts the failure with one upsert into the table Config.Table + "_failures"
// (migration 002), on the pool and after the failed transaction rolled back,
// so the count survives the rollback and the happy path never writes it. A
// count belongs to the key and its payload digest (another payload starts
// again at 1), is deleted by ForgetFailures when the runner dead-letters the
// message, and otherwise expires Config.Retention after its last failure;
// Cleanup (the janitor) deletes expired counts with the expired records.
//
// # Schema
//
// Migrate applies the embedded, numbered migrations (dedup/migrate's Dedup
// line, plain SQL with goose annotations, shared with dedup/sqldedup) for the
// configured schema and table. dedup/migrate also applies them in your
// transaction, prints them and lists those applied. Schema and table names are validated as plain identifiers
// and quoted; configuration cannot inject SQL.
package pgdedup
