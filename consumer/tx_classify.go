package consumer

import (
	"context"
	"errors"
	"log/slog"
)

// errTxEnded is the failure of a handler that ended the runner's transaction
// itself (COMMIT or ROLLBACK through tx).
var errTxEnded = errors.New("idemq: the handler ended the transaction itself (COMMIT or ROLLBACK through tx); " +
	"the rest of its batch would have run in autocommit, so the transaction is refused")

// ended reports whether the store knows, without a round trip, that tx was
// ended by a handler.
func (p *txPath[Tx]) ended(tx Tx) bool {
	return p.caps.EndedTx && p.drv.Ended(tx)
}

// forgetEnded removes the records of later, whose handlers did not run,
// after culprit's handler ended tx: a COMMIT made them durable, and their
// rerun would take them for duplicates. A failure is logged.
func (p *txPath[Tx]) forgetEnded(ctx context.Context, env *pathEnv, tx Tx, culprit *job, later []*job) {
	if !p.caps.EndedTx || len(later) == 0 {
		return
	}
	keys := make([]string, len(later))
	for i, j := range later {
		keys[i] = j.key
	}
	if err := p.drv.ForgetEnded(ctx, tx, env.scope, culprit.key, keys); err != nil {
		env.log.ErrorContext(ctx, "removing the records of messages whose handler did not run failed; they may be taken for duplicates",
			LogKeyCount, len(keys), LogKeyError, err)
	}
}

// errSwallowed is the failure of a handler that returned nil although a
// statement it sent failed and left the transaction aborted.
var errSwallowed = errors.New("idemq: the handler returned nil but a statement of its own failed and aborted the transaction (an error was swallowed)")

// failed reports whether the store knows, without a round trip, that tx has
// failed.
func (p *txPath[Tx]) failed(tx Tx) bool {
	return p.caps.FailedTx && p.drv.Failed(tx)
}

// aborted reports whether a statement's error says only that the
// transaction had already failed.
func (p *txPath[Tx]) aborted(err error) bool {
	return p.caps.Aborted && p.drv.IsAborted(err)
}

// handlerTransient reports whether a handler's error is a database condition
// that says nothing about the message: a typed driver error the store
// classifies as transient. Permanent always wins, and so does anything the
// store does not recognise (the handler's own errors, its deadline).
func (p *txPath[Tx]) handlerTransient(err error) bool {
	if IsPermanent(err) {
		return false
	}
	return p.caps.Transient && p.drv.IsTransient(err)
}

// blame settles the job whose handler failed: a transient database error
// is retried without counting an attempt, anything else is a counted
// attempt (or a dead letter for Permanent). Later messages of its partition
// are held behind it.
func (p *txPath[Tx]) blame(ctx context.Context, env *pathEnv, ord *order, j *job, err error) {
	if p.handlerTransient(err) {
		j.set(outRetryInfra, err)
		j.delay = env.infraDelay()
	} else {
		env.failure(j, err)
	}
	env.log.DebugContext(ctx, "handler failed", LogKeyKey, j.key, LogKeyAttempt, j.msg.Attempt, LogKeyError, err)
	ord.hold(j)
}

// infra settles the unsettled jobs of a transaction that failed for a reason
// of the store or the database (begin, claim or commit): nothing in it is
// durable, and nothing is counted against the messages. Their partitions are
// held, so that when jobs is a half of a bisected batch, the later messages
// of those partitions in the other half do not commit ahead of them.
func (p *txPath[Tx]) infra(ctx context.Context, env *pathEnv, ord *order, jobs []*job, err error) {
	if errors.Is(err, ErrCommit) {
		env.stats.commitFailures.Add(1)
	}
	delay := env.infraDelay()
	n := 0
	for _, j := range jobs {
		if j.out != outNone {
			continue
		}
		j.set(outRetryInfra, err)
		j.delay = delay
		if !ord.has(j.msg.PartitionKey) {
			ord.hold(j) // the first of its partition: the later ones wait
		}
		n++
	}
	env.storeOut.line(ctx, env.log, slog.LevelWarn, "transaction failed; its messages will be retried", slog.Int(LogKeyCount, n), slog.Any(LogKeyError, err))
}

// conflicted reports whether err, a transaction's failure, is a lock
// conflict with another transaction that the store classifies as transient:
// a deadlock or a serialization failure (SQLSTATE 40P01 or 40001, from a
// driver error with a SQLState method, as pgx's and lib/pq's), from a
// handler's statement or from the commit. Permanent wins, and a handler that
// ended the transaction itself is no conflict.
func (p *txPath[Tx]) conflicted(err error) bool {
	if err == nil || errors.Is(err, errTxEnded) || !p.handlerTransient(err) {
		return false
	}
	var st interface{ SQLState() string }
	if !errors.As(err, &st) {
		return false
	}
	switch st.SQLState() {
	case "40P01", "40001":
		return true
	}
	return false
}
