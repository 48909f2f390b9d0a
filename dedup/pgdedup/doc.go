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
// processed_at (dedup/migrate's migrations 004 and 005), and the janitor
// drops a day's partition instead of deleting rows. PostgreSQL enforces a
// unique key only within a partition, so the claim does it: under a
// transaction-scoped advisory lock per key (taken in one order), a later
// statement inserts the keys that no partition holds. A redelivery on a
// later day, two claims on either side of midnight, a stored result and a
// payload mismatch in an older partition are found as in one table. The
// clock that dates a record, and so chooses its partition, is Config.Now.
// docs/operations.md#partitioned-dedup-table-postgresql has the claim, its
// plans, the measurements and the migration of an existing table.
//
// # Round trips
//
// With a *pgxpool.Pool or a *pgx.Conn, BeginClaim sends BEGIN and the claim's
// insert in one pipelined round trip (pgx.Batch.BeginTx), and CommitChain
// sends COMMIT AND CHAIN with the next batch's claim, and the results
// handlers return (StoreResults), in one round trip on the same connection
// (docs/guarantees.md#how-it-works counts the round trips per message). A
// batch takes no savepoints (see dedupdriver.Tx), so it takes one
// transaction ID however many messages it holds. Commit reports a commit
// the database refused for the transaction's content with
// dedup.ErrTxRefused, and IsAborted recognises the statements refused after
// an earlier failure (SQLSTATE 25P02), so that the runner can find the
// message at fault.
//
// # Retention
//
// Records expire after Config.Retention (8 days by default; the store reports
// it to the Runner, which refuses to start when its source's broker keeps
// messages longer). An expired record no longer deduplicates. RunJanitor
// drops the partitions whose records all expired (Config.Partitioned), or
// deletes expired records in small batches, skipping locked rows, under an
// advisory lock so that one process cleans at a time, with Config.CleanupPause
// between two batches; every Config.StatsInterval it also measures the table
// for Store.TableStats.
//
// # Handler failures
//
// The store counts handler failures (dedupdriver.Caps.FailureCount) in the
// table Config.Table + "_failures" (migration 002): one upsert after a
// failed transaction rolled back, so the count survives the rollback and
// the happy path never writes it. A count belongs to the key and its payload
// digest, is deleted when the runner dead-letters the message, and
// otherwise expires Config.Retention after its last failure; the janitor
// deletes it then.
//
// # Schema
//
// Migrate applies the embedded, numbered migrations (dedup/migrate's Dedup
// line, plain SQL with goose annotations, shared with dedup/sqldedup) for the
// configured schema and table. dedup/migrate also applies them in your
// transaction, prints them and lists those applied. Schema and table names are validated as plain identifiers
// and quoted; configuration cannot inject SQL.
package pgdedup
