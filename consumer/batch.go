package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
)

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

// TransactionalBatch returns the transactional path with one handler call
// per batch instead of per message: for each batch the runner begins a
// transaction, records every key through store, calls h once with the new
// messages, commits and only then acknowledges. It has the guarantees of
// Transactional; Config.BatchSize bounds the messages per call. The runner's
// HandlerTimeout bounds each call, and DedupKey and IdempotencyKey are not
// set in its context (a batch has many keys): msg.KeyContext(ctx) gives the
// context of one message of the batch, with its keys.
//
// Hooks see the events of Transactional: a claim, a commit and a settlement
// per message, the batch, and a handler start and end for every message of
// each handler call, with the call's duration. The error of a MessageError
// is reported for its message only (its batch-mates end without an error
// and run again without it); any other error, or a panic, for every message
// of the call. A hook implementing HookTx gets a call over more than one
// message once per transaction instead, in TxInfo. The context those hooks get is the message's (with its
// DedupKey, without the handler's cancellation); the handler's own ctx
// carries no message's hook values, since it handles many.
func TransactionalBatch[Tx any](store dedup.TxStore[Tx], h TxBatchHandler[Tx]) Path {
	return &txPath[Tx]{store: store, bh: h}
}

// BatchItem is one decoded message of a TxBatchJSON handler;
// Msg.KeyContext(ctx) gives the context with its keys.
type BatchItem[T any] struct {
	Msg   *Message
	Value T
}

// TxBatchJSON adapts a typed batch handler: it decodes every message's body
// as JSON into a T and calls h with the items in delivery order. A body that
// does not decode is dead-lettered with ErrMalformed, without retries, and
// the others run without it.
//
//	consumer.TransactionalBatch(store, consumer.TxBatchJSON(func(ctx context.Context, tx pgx.Tx, items []consumer.BatchItem[Order]) error {
//		ids, amounts := make([]int64, len(items)), make([]int64, len(items))
//		for i, it := range items {
//			ids[i], amounts[i] = it.Value.Account, it.Value.Amount
//		}
//		_, err := tx.Exec(ctx, `UPDATE accounts a SET balance = a.balance + u.amount
//			FROM (SELECT id, sum(amount) AS amount FROM unnest($1::bigint[], $2::bigint[]) AS u(id, amount) GROUP BY id) u
//			WHERE a.id = u.id`, ids, amounts)
//		return err
//	}))
func TxBatchJSON[T, Tx any](h func(ctx context.Context, tx Tx, items []BatchItem[T]) error) TxBatchHandler[Tx] {
	return func(ctx context.Context, tx Tx, msgs []*Message) error {
		items := make([]BatchItem[T], len(msgs))
		for i, m := range msgs {
			v, err := decodeJSON[T](m)
			if err != nil {
				return &MessageError{Msg: m, Err: err}
			}
			items[i] = BatchItem[T]{Msg: m, Value: v}
		}
		return h(ctx, tx, items)
	}
}

// handleBatch runs the batch handler over the new messages in tx. failed
// reports that the transaction must be rolled back, with res saying why.
func (p *txPath[Tx]) handleBatch(ctx context.Context, env *pathEnv, tx Tx, fresh []*job, ti *TxInfo) (res tryResult, failed bool) {
	msgs := make([]*Message, len(fresh))
	for i, j := range fresh {
		j.msg.keys = &msgKeys{scope: env.scope, key: j.key}
		msgs[i] = j.msg
	}
	err := env.callBatch(ctx, fresh, ti, func(ctx context.Context) error { return p.bh(ctx, tx, msgs) })
	if p.ended(tx) {
		// Which messages' effects a COMMIT in the call made durable is
		// unknown: the call is refused as a whole.
		return tryResult{err: errors.Join(errTxEnded, err), suspects: fresh}, true
	}
	if err == nil && p.failed(tx) {
		err = errSwallowed
	}
	if err == nil {
		return tryResult{}, false
	}
	var me *MessageError
	if errors.As(err, &me) {
		for _, j := range fresh {
			if j.msg == me.Msg {
				return tryResult{err: me.Err, culprit: j}, true
			}
		}
	}
	if len(fresh) > 1 && p.handlerTransient(err) {
		return tryResult{err: err, infra: true}, true
	}
	return tryResult{err: err, suspects: fresh}, true
}

//END
