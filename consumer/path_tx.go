package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
)

// TxHandler handles one message inside a database transaction. Everything it
// writes through tx commits together with the message's processed record, or
// not at all. It must not commit or roll back tx, and must not keep it after
// returning. Returning an error rolls back its writes and retries the message
// (see Permanent and RetryAfter).
type TxHandler[Tx any] func(ctx context.Context, tx Tx, msg *Message) error

// ErrCommit wraps the error of a failed commit. None of the transaction's
// messages is acknowledged; they are retried, and those whose commit did
// happen after all are recognised as duplicates.
var ErrCommit = errors.New("idemq: commit failed")

// Transactional returns the path for effects in a database: for each batch the
// runner begins a transaction, records every message's key in it through
// store, runs the handler of each new key under its own savepoint, commits,
// and only then acknowledges. A key already recorded is acknowledged without
// running the handler. A failing handler's writes and record are rolled back
// to its savepoint, so its retry runs it again, while the rest of the batch
// commits.
//
// There is no duplicate window on this path: the record and the effect commit
// together, and a concurrent delivery of the same key waits on the record's
// row lock for the first transaction's outcome.
func Transactional[Tx any](store dedup.TxStore[Tx], h TxHandler[Tx]) Path {
	return &txPath[Tx]{store: store, h: h}
}

type txPath[Tx any] struct {
	store dedup.TxStore[Tx]
	h     TxHandler[Tx]
}

func (p *txPath[Tx]) process(ctx context.Context, r *Runner, batch []*job) {
	err := p.run(ctx, r, batch)
	switch {
	case err == nil:
		r.infraOK()
	case len(batch) > 1 && !p.transient(err):
		// Something in the batch fails the transaction as a whole (a key or
		// a value the database refuses, a handler that swallowed an error
		// and left the transaction aborted): handle the messages one by
		// one, so that only the culprit is retried and counted.
		r.log.Warn("batch transaction failed; handling its messages one by one", LogKeyCount, len(batch), LogKeyError, err)
		for _, j := range batch {
			if j.out != outAck && j.out != outNone {
				continue // settled on its own: a failed handler, a duplicate
			}
			j.set(outNone, nil)
			if err := p.run(ctx, r, []*job{j}); err != nil {
				p.fail(r, []*job{j}, err)
			}
		}
	default:
		p.fail(r, batch, err)
	}
}

func (p *txPath[Tx]) validate() error {
	if p.store == nil {
		return &ConfigError{Field: "Transactional store", Reason: "nil"}
	}
	if p.h == nil {
		return &ConfigError{Field: "Transactional handler", Reason: "nil"}
	}
	return nil
}

// transient reports whether a failure of the store or the transaction says
// nothing about the messages. Without a classifier every such failure is
// taken as transient: a message is never dead-lettered for it.
func (p *txPath[Tx]) transient(err error) bool {
	tc, ok := p.store.(dedup.TransientClassifier)
	return !ok || tc.IsTransient(err)
}

// handlerTransient reports whether a handler's error is a database condition
// that says nothing about the message: a typed driver error the store
// classifies as transient. Permanent always wins, and so does anything the
// store does not recognise (the handler's own errors, its deadline).
func (p *txPath[Tx]) handlerTransient(err error) bool {
	if IsPermanent(err) {
		return false
	}
	tc, ok := p.store.(dedup.TransientClassifier)
	return ok && tc.IsTransient(err)
}

// fail settles the jobs of a transaction that failed as a whole: nothing in
// it is durable. A transient failure retries them without counting an
// attempt; any other (of a single message) counts against its attempts.
func (p *txPath[Tx]) fail(r *Runner, batch []*job, err error) {
	if errors.Is(err, ErrCommit) {
		r.stats.commitFailures.Add(1)
	}
	transient := p.transient(err)
	var delay time.Duration
	if transient {
		delay = r.infraDelay()
	}
	for _, j := range batch {
		if j.out != outAck && j.out != outNone {
			continue // already settled by the handler's own failure, or a duplicate
		}
		if transient {
			j.set(outRetryInfra, err)
			j.delay = delay
		} else {
			r.failure(j, err)
		}
	}
	r.log.Warn("transaction failed; its messages will be retried", LogKeyCount, len(batch), LogKeyError, err)
}

// run processes batch in one transaction. On a nil return every job has its
// final outcome; on an error, jobs marked outAck are not durable.
func (p *txPath[Tx]) run(ctx context.Context, r *Runner, batch []*job) error {
	tx, err := p.store.Begin(ctx)
	if err != nil {
		return fmt.Errorf("idemq: begin: %w", err)
	}
	defer p.store.Rollback(context.WithoutCancel(ctx), tx) //nolint:errcheck // safe after commit

	recs := make([]dedup.Record, len(batch))
	for i, j := range batch {
		recs[i] = dedup.Record{Key: j.key, PayloadHash: j.hash}
	}
	claims, err := p.store.Claim(ctx, tx, r.cfg.Name, recs)
	if err != nil {
		return fmt.Errorf("idemq: claim: %w", err)
	}
	if len(claims) != len(batch) {
		return fmt.Errorf("idemq: claim returned %d results for %d keys", len(claims), len(batch))
	}

	fresh := 0
	for i, j := range batch {
		switch c := claims[i]; c.State {
		case dedup.StateDone:
			j.set(outDuplicate, nil)
		case dedup.StateMismatch:
			j.set(outDeadLetter, &dedup.MismatchError{Scope: r.cfg.Name, Key: j.key, Stored: c.StoredHash, Received: j.hash})
		case dedup.StateNew:
			fresh++
		default:
			return fmt.Errorf("idemq: claim of key %q returned state %v", j.key, c.State)
		}
	}
	if fresh == 0 {
		return nil // duplicates and poison only: nothing to commit
	}

	// One new message needs no savepoint: its failure rolls back everything.
	savepoints := fresh > 1
	opened, committed := false, 0
	var held heldPartitions
	for i, j := range batch {
		if claims[i].State != dedup.StateNew {
			continue
		}
		if held.holds(j) {
			// An earlier message of its partition failed: keep the order
			// by retrying this one too, and drop its record.
			if err := p.store.Unclaim(ctx, tx, r.cfg.Name, j.key); err != nil {
				return fmt.Errorf("idemq: unclaim: %w", err)
			}
			continue
		}
		if savepoints {
			if err := p.store.Savepoint(ctx, tx, opened); err != nil {
				return fmt.Errorf("idemq: savepoint: %w", err)
			}
			opened = true
		}
		err := r.call(ctx, j, func(ctx context.Context) error { return p.h(ctx, tx, j.msg) })
		if err == nil {
			j.set(outAck, nil)
			committed++
			continue
		}
		if p.handlerTransient(err) {
			j.set(outRetryInfra, err)
			j.delay = r.infraDelay()
		} else {
			r.failure(j, err)
		}
		r.log.Debug("handler failed", LogKeyKey, j.key, LogKeyAttempt, j.msg.Attempt, LogKeyError, err)
		held.hold(j)
		if !savepoints {
			return nil // deferred rollback undoes the record and the handler's writes
		}
		if err := p.store.RollbackToSavepoint(ctx, tx); err != nil {
			return fmt.Errorf("idemq: rollback to savepoint: %w", err)
		}
		if err := p.store.Unclaim(ctx, tx, r.cfg.Name, j.key); err != nil {
			return fmt.Errorf("idemq: unclaim: %w", err)
		}
	}
	if committed == 0 {
		return nil
	}
	if err := p.store.Commit(ctx, tx); err != nil {
		return fmt.Errorf("%w: %w", ErrCommit, err)
	}
	return nil
}

// heldPartitions tracks the partition keys of a batch whose message failed.
// Later messages of the same partition are not handled in that batch (they
// would overtake the failed one); they are retried without counting an
// attempt.
type heldPartitions map[string]*job

func (h *heldPartitions) hold(failed *job) {
	if failed.msg.PartitionKey == "" || (failed.out != outRetry && failed.out != outRetryInfra) {
		return
	}
	if *h == nil {
		*h = heldPartitions{}
	}
	(*h)[failed.msg.PartitionKey] = failed
}

// holds reports whether j waits behind a failed message of its partition, and
// if so sets its outcome.
func (h heldPartitions) holds(j *job) bool {
	failed := h[j.msg.PartitionKey]
	if j.msg.PartitionKey == "" || failed == nil {
		return false
	}
	j.set(outRetryInfra, fmt.Errorf("idemq: held behind failed message %q of partition %q", failed.key, j.msg.PartitionKey))
	j.delay = failed.delay
	return true
}

// failureCounter returns the store's handler-failure counter, or nil.
func (p *txPath[Tx]) failureCounter() dedup.FailureCounter {
	fc, _ := p.store.(dedup.FailureCounter)
	return fc
}
