package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
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

// callBatch runs a batch handler over the messages of jobs with the handler
// timeout and panic recovery, and reports a handler start and end for each
// of them to the hooks (see TransactionalBatch), and the call to ti (nil
// without HookTx hooks).
func (env *pathEnv) callBatch(ctx context.Context, jobs []*job, ti *TxInfo, fn func(ctx context.Context) error) (err error) {
	if env.handlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, env.handlerTimeout)
		defer cancel()
	}
	if ti != nil {
		start := time.Now()
		defer func() { ti.HandlerStart, ti.HandlerEnd, ti.HandlerErr = start, time.Now(), err }()
	}
	starts, ends := env.obs.handlerStart, env.obs.handlerEnd
	if len(jobs) > 1 {
		// The HookTx hooks get this call in TxInfo.
		starts, ends = env.obs.batchStart, env.obs.batchEnd
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
			c = withKeys(c, env.scope, j.key)
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
