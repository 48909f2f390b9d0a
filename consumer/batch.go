package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

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
func (p *txPath[Tx]) handleBatch(ctx context.Context, r *Runner, tx Tx, fresh []*job, ti *TxInfo) (res tryResult, failed bool) {
	msgs := make([]*Message, len(fresh))
	for i, j := range fresh {
		j.msg.keys = &msgKeys{scope: r.cfg.Name, key: j.key}
		msgs[i] = j.msg
	}
	err := r.callBatch(ctx, fresh, ti, func(ctx context.Context) error { return p.bh(ctx, tx, msgs) })
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

// callBatch runs a batch handler over the messages of jobs with the handler
// timeout and panic recovery, and reports a handler start and end for each
// of them to the hooks (see TransactionalBatch), and the call to ti (nil
// without HookTx hooks).
func (r *Runner) callBatch(ctx context.Context, jobs []*job, ti *TxInfo, fn func(ctx context.Context) error) (err error) {
	if r.cfg.HandlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.cfg.HandlerTimeout)
		defer cancel()
	}
	if ti != nil {
		start := time.Now()
		defer func() { ti.HandlerStart, ti.HandlerEnd, ti.HandlerErr = start, time.Now(), err }()
	}
	starts, ends := r.hooks.handlerStart, r.hooks.handlerEnd
	if len(jobs) > 1 {
		// The HookTx hooks get this call in TxInfo.
		starts, ends = r.hooks.batchStart, r.hooks.batchEnd
	}
	if len(starts) > 0 || len(ends) > 0 {
		hctx := make([]context.Context, len(jobs))
		for i, j := range jobs {
			// The handler does not run in this context: the message's
			// values and its key are enough, without the lane's
			// cancellation.
			c := j.ctx
			if c == nil {
				c = ctx
			}
			c = withKeys(c, r.cfg.Name, j.key)
			for _, h := range starts {
				c = h.OnHandlerStart(c, j.msg)
			}
			hctx[i] = c
		}
		start := time.Now()
		defer func() {
			d := time.Since(start)
			var me *MessageError
			named := errors.As(err, &me) && me.Msg != nil
			for i, j := range jobs {
				jerr := err
				if named && j.msg != me.Msg {
					jerr = nil // a batch-mate failed; this message runs again without it
				}
				for _, h := range ends {
					h.OnHandlerEnd(hctx[i], j.msg, d, jerr)
				}
			}
		}()
	}
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(ctx)
}
