package checkout

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
)

// Order is the body of a checkout message: charge Amount cents to Account.
// Its ID is also the message's idempotency key.
type Order struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"` // cents
}

// ErrUnknownAccount and ErrBadAmount reject orders that no retry can fix;
// the handlers wrap them with consumer.Permanent, so such orders go to the
// dead-letter destination at once.
var (
	ErrUnknownAccount = errors.New("checkout: unknown account")
	ErrBadAmount      = errors.New("checkout: amount must be positive")
)

// ChargeSQL is the checkout handler on database/sql (SQLite through
// dedup/sqldedup): it debits the account and writes the ledger row in tx, the
// transaction that also records the order's key. Both writes commit together
// with the record, once, or not at all.
var ChargeSQL = consumer.TxJSON(func(ctx context.Context, tx *sql.Tx, _ *consumer.Message, o Order) error {
	if o.Amount <= 0 {
		return consumer.Permanent(fmt.Errorf("order %s: %w", o.ID, ErrBadAmount))
	}
	res, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance - ? WHERE id = ?`, o.Amount, o.Account)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(err, consumer.Permanent(fmt.Errorf("order %s: %w %q", o.ID, ErrUnknownAccount, o.Account)))
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO ledger (order_id, account, amount) VALUES (?, ?, ?)`, o.ID, o.Account, o.Amount)
	return err
})

// ChargePgx is ChargeSQL for PostgreSQL through pgx and dedup/pgdedup, on
// the tables of schema.
func ChargePgx(schema string) consumer.TxHandler[pgx.Tx] {
	accounts := pgx.Identifier{schema, "accounts"}.Sanitize()
	ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
	return consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, o Order) error {
		if o.Amount <= 0 {
			return consumer.Permanent(fmt.Errorf("order %s: %w", o.ID, ErrBadAmount))
		}
		tag, err := tx.Exec(ctx, `UPDATE `+accounts+` SET balance = balance - $1 WHERE id = $2`, o.Amount, o.Account)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return consumer.Permanent(fmt.Errorf("order %s: %w %q", o.ID, ErrUnknownAccount, o.Account))
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+ledger+` (order_id, account, amount) VALUES ($1, $2, $3)`, o.ID, o.Account, o.Amount)
		return err
	})
}

// Message returns o as a message to publish: its JSON body, its ID as the
// idempotency key and its account as the partition key, so that one
// account's charges are applied in order.
func (o Order) Message() Outgoing {
	body, _ := json.Marshal(o) // cannot fail: strings and an integer
	return Outgoing{Key: o.ID, Body: body, PartitionKey: o.Account}
}

// SampleOrder returns order n of a run named run: a fixed account and amount
// (100 to 9 999 cents) derived from n, over accounts accounts.
func SampleOrder(run string, n, accounts int) Order {
	return Order{
		ID:      fmt.Sprintf("%s-%06d", run, n),
		Account: AccountID(n % accounts),
		Amount:  int64(100 + (n*7919)%9900),
	}
}
