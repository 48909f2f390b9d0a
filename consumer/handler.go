package consumer

import (
	"context"
	"encoding/json"
	"fmt"
)

// TxHandler handles one message inside a database transaction. Everything it
// writes through tx commits together with the message's processed record, or
// not at all. It must not commit or roll back tx, and must not keep it after
// returning. Returning an error rolls back its writes and retries the message
// (see Permanent and RetryAfter).
//
// In a batch (Config.BatchSize above 1) the handler may run again for a
// message whose batch-mate failed: the transaction is rolled back and rerun
// without the culprit. Its writes commit once; effects outside tx must not
// be made from a TxHandler (use Leased for those).
type TxHandler[Tx any] func(ctx context.Context, tx Tx, msg *Message) error

// Handler handles one message whose effect happens outside a database
// transaction (an email, a webhook, a third-party API call). It should pass
// IdempotencyKey(ctx) to the downstream system as an idempotency key. Returning an
// error releases the lease and retries the message (see Permanent and
// RetryAfter).
type Handler func(ctx context.Context, msg *Message) error

// TxBatchHandler handles the new messages of a batch together, inside one
// database transaction, so that it can write them with set-based or
// pipelined statements (one UPDATE … FROM unnest(…), a pgx.Batch, a COPY)
// instead of one round trip per message. msgs holds only the batch's new
// messages, already claimed in tx, in delivery order; duplicates and
// mismatches never reach it. Everything it writes through tx commits together
// with their records, or not at all. It must not commit or roll back tx, and
// must not keep tx or msgs after returning.
//
// Returning an error rolls the transaction back. To name the message at
// fault, return a *MessageError: that message alone is retried and counted
// (or dead-lettered, if its error is Permanent), and the others run again
// without it. Any other error is searched for by splitting the messages in
// halves, each in its own transaction, until the failing one is alone; only
// it is counted. A transient database error of the whole batch (a deadlock)
// retries every message without counting. The handler may therefore run
// again for a message whose batch-mate failed; its writes commit once.
type TxBatchHandler[Tx any] func(ctx context.Context, tx Tx, msgs []*Message) error

// MessageError is the error a TxBatchHandler returns to name the message of
// its batch that failed, so that only that message is retried and counted.
// Msg must be one of the messages the handler received.
type MessageError struct {
	Msg *Message
	Err error
}

// Error implements error.
func (e *MessageError) Error() string {
	if e.Msg == nil {
		return fmt.Sprintf("idemq: message <nil>: %v", e.Err)
	}
	return fmt.Sprintf("idemq: message %q: %v", e.Msg.ID, e.Err)
}

// Unwrap returns the message's own error, so that Permanent and RetryAfter
// inside it take effect.
func (e *MessageError) Unwrap() error { return e.Err }

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
