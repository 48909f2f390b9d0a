package consumer

import (
	"context"
	"errors"
	"time"
)

// callBatch runs a batch handler over the messages of jobs with the handler
// timeout and panic recovery, and reports a handler start and end for each
// of them to the hooks (see TransactionalBatch), and the call to ti (nil
// without HookTx hooks).
func (env *pathEnv) callBatch(ctx context.Context, jobs []*job, ti *TxInfo, fn func(ctx context.Context) error) (err error) {
	for _, j := range jobs {
		j.msg.setReturned(nil, false) // a batch run again starts with no results
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
			c = withKeys(c, &j.msg.keys)
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
	return env.guard(ctx, fn)
}
