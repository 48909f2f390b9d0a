package consumer

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"time"
)

// pathEnv is what a Path gets from its Runner, as values: the scope, the
// logger, the configuration it reads, the counters, the store's outage
// tracker, the observer of the hooks, and the helpers that call a handler
// and classify its failure. A path never reaches into the Runner. Built
// once in NewRunner; safe for concurrent use by the lanes.
type pathEnv struct {
	scope          string        // Config.Name: the scope of every key
	log            *slog.Logger  // with the consumer's name
	retry          RetryPolicy   // Config.Retry, with defaults
	handlerTimeout time.Duration // Config.HandlerTimeout; 0: none
	stats          *counters
	storeOut       *outage // the store's run of failures (see Health)
	obs            *observer
	// takeAhead takes a lane's next batch without waiting and prepares it
	// (see Runner.takeAhead); nil when there is none to take.
	takeAhead func(ctx context.Context, l *lane) *prepared
}

// infraDelay counts a failure of the store and returns the retry delay,
// growing with the run of such failures (not with the message's attempts,
// which these failures do not count) up to outageProbe, so that the
// messages sent back come again soon after the store answers; while the
// outage lasts, receiving is paused (awaitStore). handle logs the outage
// once it lasts.
func (env *pathEnv) infraDelay() time.Duration {
	return min(env.retry.Backoff(env.storeOut.fail()), outageProbe)
}

// infraOK ends a run of store failures.
func (env *pathEnv) infraOK() { env.storeOut.succeed() }

// call runs a handler with the key in its context, the handler timeout, and
// panic recovery.
func (env *pathEnv) call(ctx context.Context, j *job, fn func(ctx context.Context) error) (err error) {
	ctx = withKeys(env.obs.msgCtx(ctx, j), env.scope, j.key)
	if env.handlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, env.handlerTimeout)
		defer cancel()
	}
	if len(env.obs.handlerStart) > 0 || len(env.obs.handlerEnd) > 0 {
		for _, h := range env.obs.handlerStart {
			ctx = h.OnHandlerStart(ctx, j.msg)
		}
		start := time.Now()
		defer func() {
			d := time.Since(start)
			for _, h := range env.obs.handlerEnd {
				h.OnHandlerEnd(ctx, j.msg, d, err)
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

// backoff returns the delay before a failed job's next attempt: the one its
// handler asked for with RetryAfter, else the policy's. It is computed once
// per failure, so that messages held behind the job can wait as long.
func (env *pathEnv) backoff(j *job) time.Duration {
	if j.delay > 0 {
		return j.delay
	}
	if d, ok := retryDelay(j.err); ok {
		return d
	}
	return env.retry.Backoff(j.attempt())
}

// failure classifies a handler error into an outcome.
func (env *pathEnv) failure(j *job, err error) {
	if IsPermanent(err) {
		j.set(outDeadLetter, err)
		return
	}
	j.set(outRetry, err)
	j.delay = env.backoff(j)
}

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
