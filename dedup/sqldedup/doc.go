// Package sqldedup is the database/sql store of idemq's transactional path,
// with dialects for SQLite (modernc.org/sqlite, pure Go) and PostgreSQL
// (github.com/jackc/pgx/v5/stdlib, or any PostgreSQL driver). Its driver
// implements dedupdriver.Tx[*sql.Tx], so users of database/sql, sqlx, sqlc and similar
// get the *sql.Tx that also records their message, and the runner is the same
// one that drives dedup/pgdedup:
//
//	db, err := sqldedup.OpenSQLite(ctx, "checkout.db") // import _ "modernc.org/sqlite"
//	store, err := sqldedup.New(db, sqldedup.Config{Dialect: sqldedup.SQLite})
//	err = store.Migrate(ctx)
//	path := consumer.Transactional(store, consumer.TxJSON(func(ctx context.Context, tx *sql.Tx, msg *consumer.Message, o Order) error {
//		_, err := tx.ExecContext(ctx, `INSERT INTO ledger (order_id, amount) VALUES (?, ?)`, o.ID, o.Amount)
//		return err
//	}))
//
// # Guarantees
//
// A message's record (scope, key, payload hash, processed and expiry time) is
// inserted in the same transaction as the handler's writes: both commit or
// neither does, and the runner acknowledges a message only after the commit.
// There is no duplicate window. The primary key (scope, key) makes a
// duplicate check one index lookup, whatever the size of the table.
//
// PostgreSQL: a concurrent claim of the same key waits on the first
// transaction's row and then sees its outcome, so the handler never runs
// twice for one key. Keys of a batch are inserted in ascending order, so
// concurrent batches cannot deadlock on records. Use the default READ
// COMMITTED isolation. The table and its migrations are those of
// dedup/pgdedup, so both stores can share one table.
//
// SQLite: a database has one writer at a time, and that is how claims are
// serialised. OpenSQLite opens the file with BEGIN IMMEDIATE transactions
// (the write lock is taken at Begin, so a transaction never fails halfway on
// a lock upgrade), a busy timeout (a writer in another process is waited for,
// not failed), WAL (readers never block the writer) and synchronous=FULL (a
// commit is on disk before the message is acknowledged), and it limits the
// pool to one connection, so the runner's concurrent batches queue in
// database/sql instead of polling the file lock. Concurrency above 1 is safe
// but does not add write throughput; raise Config.BatchSize instead. Opened
// any other way, the store stays correct: the first statement of the
// runner's transaction is Claim's insert, which takes the write lock (waiting
// for it as long as the busy timeout allows); without a busy timeout a
// contended claim fails with SQLITE_BUSY and the runner retries the batch
// later, without counting it against the messages.
//
// # Retention
//
// Records expire after Config.Retention (8 days by default, above the default
// retention of SQS queues and Kafka topics; the store reports it to the
// Runner, which refuses to start when its source's broker keeps messages
// longer). An expired record no longer deduplicates and is claimed anew;
// RunJanitor deletes expired records in small batches (on PostgreSQL
// skipping locked rows, under an advisory lock so that one process cleans at
// a time). Every
// Config.StatsInterval (5 min) it also measures the table after its cleanup
// (records per scope, the oldest record), which Store.TableStats returns
// without a query and otelidemq's Hook.ObserveDedup exports as gauges.
//
// # Handler failures
//
// The store counts handler failures (dedupdriver.Caps.FailureCount): when a handler fails, the runner
// counts the failure with one upsert into the table Config.Table + "_failures"
// (migration 002, both dialects), after the failed transaction rolled back,
// so the count survives the rollback and the happy path never writes it. A
// count belongs to the key and its payload digest (another payload starts
// again at 1), is deleted by ForgetFailures when the runner dead-letters the
// message, and otherwise expires Config.Retention after its last failure;
// Cleanup (the janitor) deletes expired counts with the expired records.
//
// # Schema
//
// Migrate applies the embedded, numbered migrations of the dialect (those of
// dedup/migrate's Dedup line: for PostgreSQL the files dedup/pgdedup
// applies too) for the configured schema and table. dedup/migrate also
// applies them in your transaction, prints them and lists those applied. Schema and
// table names are validated as plain identifiers and quoted; configuration
// cannot inject SQL. SQLite stores times as Unix microseconds (UTC).
package sqldedup
