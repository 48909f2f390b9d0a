package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
)

// try runs jobs in one transaction. Duplicates and mismatches are settled
// from the claim whatever happens next; the new messages are marked outAck
// only once the commit succeeded.
func (p *txPath[Tx]) try(ctx context.Context, env *pathEnv, jobs []*job, l *lane) tryResult {
	var ti *TxInfo // for the HookTx hooks
	if len(env.obs.tx) > 0 {
		ti = &TxInfo{Claimed: jobCtxs(ctx, jobs)}
		defer env.obs.onTx(ctx, ti)
	}
	o := p.open(ctx, env, jobs, l)
	tx, claims, err := o.tx, o.claims, o.err
	if ti != nil {
		ti.ClaimStart, ti.ClaimEnd, ti.ClaimErr = o.start, o.end, err
	}
	for i, j := range jobs {
		// A rerun claims again: the claim reported is the one of the
		// job's last transaction, which committed it or decided its outcome.
		env.obs.noteClaim(j, o.start, o.end, len(jobs), err == nil && i < len(claims) && claims[i].State == dedup.StateNew)
	}
	if err != nil {
		return tryResult{err: err, infra: true}
	}
	chained := false
	defer func() {
		if !chained {
			_ = p.drv.Rollback(context.WithoutCancel(ctx), tx) // safe after commit
		}
	}()
	if len(claims) != len(jobs) {
		return tryResult{err: fmt.Errorf("idemq: claim returned %d results for %d keys", len(claims), len(jobs)), infra: true}
	}

	news := 0
	for i, j := range jobs {
		switch c := claims[i]; c.State {
		case dedup.StateNew:
			news++
		case dedup.StateDone:
			j.set(outDuplicate, nil)
			j.replay(c.Result) // result.go: the stored result, for StoredResult
		case dedup.StateMismatch:
			j.set(outDeadLetter, &dedup.MismatchError{Scope: env.scope, Key: j.key, Stored: c.StoredHash, Received: j.hash})
		default:
			return tryResult{err: fmt.Errorf("idemq: claim of key %q returned state %v", j.key, c.State), infra: true}
		}
	}
	fresh := jobs // every key new: the usual case
	if news < len(jobs) {
		fresh = make([]*job, 0, news)
		for _, j := range jobs {
			if j.out == outNone {
				fresh = append(fresh, j)
			}
		}
	}
	if len(fresh) == 0 {
		return tryResult{} // duplicates and poison only: nothing to commit
	}

	if ti != nil {
		ti.New = jobCtxs(ctx, fresh)
	}
	if res, failed := p.handle(ctx, env, tx, fresh, ti); failed {
		return res
	}
	// result.go: the handlers' results go into their records, in tx.
	if res, failed := p.storeResults(ctx, env, tx, fresh); failed {
		return res
	}
	commitStart := env.obs.now()
	chained, err = p.commit(ctx, env, tx, l)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrCommit, err)
	}
	c := commitInfo(commitStart, len(fresh), err)
	env.obs.onCommit(fresh, c)
	if ti != nil {
		ti.Commit = c
	}
	if err != nil {
		if errors.Is(err, dedup.ErrTxRefused) {
			// The database refused the content: a handler swallowed a
			// statement's error, or a deferred constraint failed.
			env.stats.commitFailures.Add(1)
			return tryResult{err: err, suspects: fresh}
		}
		return tryResult{err: err, infra: true}
	}
	for _, j := range fresh {
		j.set(outAck, nil)
		j.handled() // result.go: for StoredResult
	}
	return tryResult{}
}

// handle runs the handlers of the new messages in tx. failed reports that
// the transaction must be rolled back, with res saying why.
func (p *txPath[Tx]) handle(ctx context.Context, env *pathEnv, tx Tx, fresh []*job, ti *TxInfo) (res tryResult, failed bool) {
	if p.bh != nil {
		return p.handleBatch(ctx, env, tx, fresh, ti)
	}
	for i, j := range fresh {
		err := env.call(ctx, j, func(ctx context.Context) error {
			if err := p.h(ctx, tx, j.msg); err != nil {
				return err
			}
			_, err := env.checkResult(j) // a result above Config.MaxResultBytes
			return err
		})
		switch {
		case p.ended(tx):
			// Its COMMIT made the records of the later messages durable
			// before their handlers ran: remove them, or their rerun
			// would take them for duplicates.
			p.forgetEnded(ctx, env, tx, j, fresh[i+1:])
			return tryResult{err: errors.Join(errTxEnded, err), culprit: j}, true
		case err == nil && p.failed(tx):
			return tryResult{err: errSwallowed, culprit: j}, true
		case err == nil:
			continue
		case p.aborted(err):
			// Refused only because the transaction had failed before:
			// this message or an earlier one swallowed an error.
			return tryResult{err: err, suspects: fresh[:i+1]}, true
		default:
			return tryResult{err: err, culprit: j}, true
		}
	}
	return tryResult{}, false
}

// handleBatch runs the batch handler over the new messages in tx. failed
// reports that the transaction must be rolled back, with res saying why.
func (p *txPath[Tx]) handleBatch(ctx context.Context, env *pathEnv, tx Tx, fresh []*job, ti *TxInfo) (res tryResult, failed bool) {
	msgs := make([]*Message, len(fresh))
	for i, j := range fresh {
		msgs[i] = j.msg // its keys are set (prepareBatch), for Message.KeyContext
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
		// env.go: checkResult refuses a result (Message.SetResult) above
		// Config.MaxResultBytes; the others run again without it.
		for _, j := range fresh {
			if _, rerr := env.checkResult(j); rerr != nil {
				return tryResult{err: rerr, culprit: j}, true
			}
		}
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
