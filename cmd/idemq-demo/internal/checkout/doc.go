// Package checkout is idemq's showcase worker: a payments worker whose orders
// arrive on a broker (in-memory, Kafka, SQS or RabbitMQ) and each charge an
// account and write a ledger row, in the handler's database transaction
// (SQLite through dedup/sqldedup, or PostgreSQL through dedup/pgdedup):
//
//	var ChargeSQL = consumer.TxJSON(func(ctx context.Context, tx *sql.Tx, _ *consumer.Message, o Order) error {
//		res, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance - ? WHERE id = ?`, o.Amount, o.Account)
//		...
//		_, err = tx.ExecContext(ctx, `INSERT INTO ledger (order_id, account, amount) VALUES (?, ?, ?)`, o.ID, o.Account, o.Amount)
//		return err
//	})
//
// The runner records the order's idempotency key (its ID, sent in the
// KeyHeader header or attribute) in the same transaction, commits, and only
// then acknowledges, so every order is charged exactly once in effect: a
// redelivery, a producer's retry with the same key or a concurrent delivery
// to a second worker is acknowledged without charging again. An order that
// can never succeed (a body that is not JSON, an unknown account, a
// non-positive amount) goes to the broker's dead-letter destination.
//
// The ledger has no unique constraint on order_id on purpose: a double
// charge would show up as a second row, which Store.Ledger counts. The
// command in cmd/internal/checkout runs the worker with flags; `make demo` (cmd/idemq-demo) runs it as
// a child process that it kills and restarts while a chaos producer re-sends
// orders, and then checks the ledger.
//
// EnableEvents adds an "order charged" event to each charge, written with
// sinks/outbox's Publish in the same transaction; the demo relays those
// events to a second consumer.
//
// Remaining duplicate window: none. The charge, the ledger row and the
// record commit in one transaction.
package checkout
