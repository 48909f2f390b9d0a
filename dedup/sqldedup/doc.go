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
// serialised. OpenSQLite opens the file so that a transaction takes the
// write lock at Begin, waits for a writer in another process, and is on disk
// before the message is acknowledged (SQLiteDSN lists the settings), with one
// connection, so the runner's concurrent batches queue in database/sql:
// Concurrency above 1 is safe but does not add write throughput; raise
// Config.BatchSize instead. Opened any other way, the store stays correct:
// Claim's insert, the first statement of the runner's transaction, takes
// the write lock, and without a busy timeout a contended claim fails with
// SQLITE_BUSY, which the runner retries without counting it against the
// messages.
//
// # Retention and handler failures
//
// As in dedup/pgdedup: records expire after Config.Retention (8 days by
// default), RunJanitor deletes expired records in small batches (on
// PostgreSQL skipping locked rows, under an advisory lock so that one
// process cleans at a time) and measures the table every
// Config.StatsInterval for Store.TableStats, and handler failures are
// counted in the table Config.Table + "_failures" (migration 002, both
// dialects), written only after a failed transaction rolled back.
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
