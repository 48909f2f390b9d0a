package consumer

import (
	"errors"
	"time"

	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/internal/cfgerr"
)

// ErrCommit wraps the error of a failed commit. None of the transaction's
// messages is acknowledged; they are retried, and those whose commit did
// happen after all are recognised as duplicates.
var ErrCommit = errors.New("idemq: commit failed")

// Transactional returns the path for effects in a database: for each batch
// the runner begins a transaction, records every message's key in it
// through store, runs the handler of each new key, commits, and only then
// acknowledges. A key already recorded is acknowledged without running the
// handler. store is a pgdedup.Store, a sqldedup.Store, or anything else
// whose Driver returns a dedupdriver.Tx; the runner asks the driver once
// for its capabilities (dedupdriver.Caps) and takes its paths from them.
//
// A batch runs without savepoints. When a handler fails, the transaction is
// rolled back (with the failed message's record and writes) and the batch
// runs again without it, and without the later messages of its
// PartitionKey, which are retried without counting an attempt so that they
// do not overtake it; so are the messages of its PartitionKey that the
// runner received before it was handed back and that wait in later batches.
// Only the culprit's attempt is counted. A statement
// refused because the transaction was already aborted (an earlier handler
// swallowed its error) and a refused commit do not name the culprit: the
// runner then splits the suspects in halves until it finds it, each half in
// its own transaction, again counting only the culprit. A handler's writes
// never commit twice.
//
// A batch that fails on a lock conflict with another transaction (a
// deadlock or a serialization failure, SQLSTATE 40P01 or 40001, from a
// handler's statement or from the commit, when the store classifies it as
// transient) is not rerun whole, where its messages would lock against the
// other transaction again: its messages are rerun one per transaction, in
// order, without counting an attempt. A message that conflicts again on its
// own is retried without counting an attempt, and the later messages of its
// PartitionKey wait behind it. The lane's next batch runs at full size.
//
// When the store chains commits (dedupdriver.Caps.CommitChain, as pgdedup's does) and a
// lane's next batch is already queued, the lane takes that batch before it
// commits, and the commit begins the next transaction and claims the next
// batch's keys in the same round trip. Nothing of the next batch is
// acknowledged before its own commit. With Config.BatchWait set (and
// BatchSize above 1), batches wait to fill instead and commits are not
// chained.
//
// There is no duplicate window on this path: the record and the effect commit
// together, and a concurrent delivery of the same key waits on the record's
// row lock for the first transaction's outcome.
func Transactional[Tx any](store dedupdriver.TxStore[Tx], h TxHandler[Tx]) Path {
	return newTxPath(store, h, nil)
}

// TransactionalBatch returns the transactional path with one handler call
// per batch instead of per message: for each batch the runner begins a
// transaction, records every key through store, calls h once with the new
// messages, commits and only then acknowledges. It has the guarantees of
// Transactional, but a call over several messages that fails on a lock
// conflict (or another transient database error) hands its batch back
// whole, retried without counting an attempt; Config.BatchSize bounds the
// messages per call. The runner's
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
func TransactionalBatch[Tx any](store dedupdriver.TxStore[Tx], h TxBatchHandler[Tx]) Path {
	return newTxPath(store, nil, h)
}

// txPath is the transactional path, with a handler per message (h) or one
// for the whole batch (bh), over the driver of store and its capabilities.
type txPath[Tx any] struct {
	pathStore[dedupdriver.Tx[Tx]]
	h  TxHandler[Tx]
	bh TxBatchHandler[Tx]
}

func newTxPath[Tx any](store dedupdriver.TxStore[Tx], h TxHandler[Tx], bh TxBatchHandler[Tx]) *txPath[Tx] {
	return &txPath[Tx]{pathStore: newPathStore[dedupdriver.Tx[Tx]](store), h: h, bh: bh}
}

func (p *txPath[Tx]) validate() error {
	var l cfgerr.List
	p.pathStore.validate(&l, "Transactional")
	if p.h == nil && p.bh == nil {
		l.Add("Transactional handler", "nil")
	}
	return l.Err()
}

// tryResult is the outcome of one transaction over a batch's unsettled jobs.
type tryResult struct {
	err      error
	infra    bool   // the store or the database failed: nobody's fault
	culprit  *job   // the message whose handler failed
	suspects []*job // one of these failed, in order (when culprit is nil)
}

// poolSize returns the connection pool size of the path's store, or 0 when
// the store does not report one (dedupdriver.Caps.Pool).
func (p *txPath[Tx]) poolSize() int {
	if p.caps.Pool {
		return p.drv.PoolSize()
	}
	return 0
}

// retention returns the retention the store's driver reports
// (dedupdriver.Caps.Retention), and false when it reports none.
func (p *txPath[Tx]) retention() (time.Duration, bool) {
	return p.caps.Retention, p.caps.Retention > 0
}
