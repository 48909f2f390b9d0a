package consumer

import (
	"context"
	"encoding/json"
	"fmt"
)

// TxJSON adapts a typed transactional handler: it decodes the body as JSON
// into a T and calls h. A body that does not decode is dead-lettered with
// ErrMalformed, without retries.
//
//	consumer.Transactional(store, consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message, o Order) error {
//		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - $1 WHERE id = $2`, o.Amount, o.Account)
//		return err
//	}))
func TxJSON[T, Tx any](h func(ctx context.Context, tx Tx, msg *Message, v T) error) TxHandler[Tx] {
	return func(ctx context.Context, tx Tx, msg *Message) error {
		v, err := decodeJSON[T](msg)
		if err != nil {
			return err
		}
		return h(ctx, tx, msg, v)
	}
}

// JSON adapts a typed handler of the lease path: it decodes the body as JSON
// into a T and calls h. A body that does not decode is dead-lettered with
// ErrMalformed, without retries.
func JSON[T any](h func(ctx context.Context, msg *Message, v T) error) Handler {
	return func(ctx context.Context, msg *Message) error {
		v, err := decodeJSON[T](msg)
		if err != nil {
			return err
		}
		return h(ctx, msg, v)
	}
}

func decodeJSON[T any](msg *Message) (T, error) {
	var v T
	if err := json.Unmarshal(msg.Body, &v); err != nil {
		return v, fmt.Errorf("%w: decoding %T: %w", ErrMalformed, v, err)
	}
	return v, nil
}
