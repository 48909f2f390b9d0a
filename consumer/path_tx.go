package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/idemq/idemq/dedup"
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
	store any // the user's store, for the start line
	drv   dedupdriver.Tx[Tx]
	caps  dedupdriver.Caps
	h     TxHandler[Tx]
	bh    TxBatchHandler[Tx]
}

func newTxPath[Tx any](store dedupdriver.TxStore[Tx], h TxHandler[Tx], bh TxBatchHandler[Tx]) *txPath[Tx] {
	p := &txPath[Tx]{store: store, h: h, bh: bh}
	if !cfgerr.IsNil(store) {
		p.drv = store.Driver()
	}
	if !cfgerr.IsNil(p.drv) {
		p.caps = p.drv.Caps()
	}
	return p
}

func (p *txPath[Tx]) validate() error {
	var l cfgerr.List
	switch {
	case cfgerr.IsNil(p.store):
		l.Add("Transactional store", "nil")
	case cfgerr.IsNil(p.drv):
		l.Add("Transactional store", "its Driver is nil")
	}
	if p.h == nil && p.bh == nil {
		l.Add("Transactional handler", "nil")
	}
	return l.Err()
}

func (p *txPath[Tx]) process(ctx context.Context, env *pathEnv, batch []*job, l *lane) {
	var held heldPartitions
	p.runAll(ctx, env, &held, batch, l)
}

// runAll settles every job of jobs, in as many transactions as it takes:
// one on the happy path, one more per culprit found by its own error, a
// halving of the suspects for a failure that names no culprit, and smaller
// transactions after a lock conflict (see conflicted). With a lane
// (not while it searches for a culprit among suspects), a transaction may
// use the one chained for jobs and chain its commit to the lane's next
// batch; a successful transaction is always the last.
func (p *txPath[Tx]) runAll(ctx context.Context, env *pathEnv, held *heldPartitions, jobs []*job, l *lane) {
	for {
		jobs = held.pending(jobs)
		if len(jobs) == 0 {
			return
		}
		res := p.try(ctx, env, jobs, l)
		switch {
		case res.err == nil:
			env.infraOK()
			return
		case p.h != nil && len(jobs) > 1 && p.conflicted(res.err):
			// Another transaction holds rows this one needs, and it
			// needs rows this one holds: rerun at full size, the same
			// messages would meet and lock against it again.
			if errors.Is(res.err, ErrCommit) {
				env.stats.commitFailures.Add(1)
			}
			env.log.DebugContext(ctx, "transaction failed on a lock conflict; rerunning its messages in smaller transactions",
				LogKeyCount, len(jobs), LogKeyError, res.err)
			// Handlers called one by one hold their locks for as many
			// round trips as messages: halves would deadlock again.
			// (A batch call sends its statements together: measured
			// with bench/core -contention, its batch handed back whole
			// beat reruns in halves or one by one, so TransactionalBatch
			// keeps doing that.)
			p.runEach(ctx, env, held, jobs)
			return
		case res.infra || (res.culprit == nil && len(res.suspects) == 0):
			p.infra(ctx, env, held, jobs, res.err)
			return
		case res.culprit != nil:
			p.blame(ctx, env, held, res.culprit, res.err)
		case len(res.suspects) == 1:
			p.blame(ctx, env, held, res.suspects[0], res.err)
		default:
			// One of the suspects failed without saying so. Run the first
			// half on its own: it commits, or narrows the search; the
			// loop then takes the rest.
			env.log.DebugContext(ctx, "transaction failed without naming a message; splitting it",
				LogKeyCount, len(res.suspects), LogKeyError, res.err)
			p.runAll(ctx, env, held, res.suspects[:len(res.suspects)/2], nil)
		}
	}
}

// runEach settles every job of jobs one message per transaction, in order,
// after their transaction failed on a lock conflict (see conflicted): no
// attempt is counted for that failure. A message that fails on its own is
// blamed as in runAll (a conflict again is retried without counting an
// attempt), and the later messages of its partition are held behind it. A
// failure of the store that is no lock conflict settles the rest as runAll
// does. No commit is chained: the lane's next batch begins its own
// transaction, at full size.
func (p *txPath[Tx]) runEach(ctx context.Context, env *pathEnv, held *heldPartitions, jobs []*job) {
	for {
		// A failed job stays first in jobs until this call, which holds
		// the later jobs of its partition and drops it.
		jobs = held.pending(jobs)
		if len(jobs) == 0 {
			return
		}
		res := p.try(ctx, env, jobs[:1], nil)
		switch {
		case res.err == nil:
			env.infraOK()
		case res.culprit != nil || len(res.suspects) > 0:
			// The message failed on its own (its culprit or only suspect).
			p.blame(ctx, env, held, jobs[0], res.err)
		case p.conflicted(res.err):
			p.infra(ctx, env, held, jobs[:1], res.err) // its commit
		default:
			p.infra(ctx, env, held, jobs, res.err)
			return
		}
	}
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

// tryResult is the outcome of one transaction over a batch's unsettled jobs.
type tryResult struct {
	err      error
	infra    bool   // the store or the database failed: nobody's fault
	culprit  *job   // the message whose handler failed
	suspects []*job // one of these failed, in order (when culprit is nil)
}

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
	if env.obs.claimsTimed() {
		// A rerun claims again: the claim reported is the one of the
		// job's last transaction, which committed it or decided its
		// outcome.
		for i, j := range jobs {
			env.obs.noteClaim(j, o.start, o.end, len(jobs), err == nil && i < len(claims) && claims[i].State == dedup.StateNew)
		}
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
			j.replay(c.Result) // result.go: the stored result, for Message.Outcome
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
	var commitStart time.Time
	if len(env.obs.commit) > 0 || ti != nil {
		commitStart = time.Now()
	}
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
		j.handled() // result.go: for Message.Outcome
	}
	return tryResult{}
}

// storeResults writes the results of fresh's handlers into their records in
// tx, in one call to the store, before the commit. failed reports that the
// transaction must be rolled back, with res saying why: a store that keeps
// no results blames the first message with one; a statement refused because
// a handler aborted the transaction makes every handler a suspect; any
// other failure is the store's.
func (p *txPath[Tx]) storeResults(ctx context.Context, env *pathEnv, tx Tx, fresh []*job) (res tryResult, failed bool) {
	var (
		results []dedup.Result
		first   *job
	)
	for _, j := range fresh {
		if v, ok := j.result(); ok {
			results = append(results, dedup.Result{Key: j.key, Value: v})
			if first == nil {
				first = j
			}
		}
	}
	if len(results) == 0 {
		return tryResult{}, false
	}
	if !p.caps.Results {
		return tryResult{err: Permanent(fmt.Errorf("%w: %T keeps no results", ErrResultUnsupported, p.store)), culprit: first}, true
	}
	err := p.drv.StoreResults(ctx, tx, env.scope, results)
	switch {
	case err == nil:
		return tryResult{}, false
	case errors.Is(err, ErrResultUnsupported), errors.Is(err, dedupdriver.ErrUnsupported): // a wrapper of a store without results
		return tryResult{err: Permanent(err), culprit: first}, true
	case p.aborted(err):
		return tryResult{err: err, suspects: fresh}, true
	default:
		return tryResult{err: fmt.Errorf("idemq: store results: %w", err), infra: true}, true
	}
}

// openTx is a transaction that claimed the keys of jobs: begun for them, or
// chained into the commit of the lane's last batch.
type openTx[Tx any] struct {
	drv        dedupdriver.Tx[Tx]
	jobs       []*job
	tx         Tx
	claims     []dedup.Claim
	err        error // of the begin or claim: no transaction is open
	start, end time.Time
}

func (o *openTx[Tx]) abandon(ctx context.Context) {
	_ = o.drv.Rollback(context.WithoutCancel(ctx), o.tx)
}

// open returns a transaction that claimed the keys of jobs: the lane's
// chained one when it was chained for these jobs, else a new one. The claim
// is timed for the hooks that report it.
func (p *txPath[Tx]) open(ctx context.Context, env *pathEnv, jobs []*job, l *lane) *openTx[Tx] {
	if l != nil && l.chain != nil {
		o, ok := l.chain.(*openTx[Tx])
		if ok && slices.Equal(o.jobs, jobs) {
			l.chain = nil
			return o
		}
		l.abandon(ctx) // its claims would block ours
	}
	o := &openTx[Tx]{drv: p.drv, jobs: jobs}
	o.timed(env, func() { o.tx, o.claims, o.err = p.beginClaim(ctx, env.scope, dedupRecords(jobs)) })
	return o
}

// timed runs claim and, when hooks report claims, records when it started
// and ended.
func (o *openTx[Tx]) timed(env *pathEnv, claim func()) {
	if !env.obs.claimsTimed() && len(env.obs.tx) == 0 {
		claim()
		return
	}
	o.start = time.Now()
	claim()
	o.end = time.Now()
}

// dedupRecords returns the dedup records of jobs.
func dedupRecords(jobs []*job) []dedup.Record {
	recs := make([]dedup.Record, len(jobs))
	for i, j := range jobs {
		recs[i] = dedup.Record{Key: j.key, PayloadHash: j.hash}
	}
	return recs
}

// commit commits tx. When the store can chain a commit and the lane has a
// next batch queued, the commit begins that batch's transaction and claims
// its keys in the same round trip; chained reports that tx is then open
// for it, in l.chain. err is the commit's: a failed claim after a commit
// only leaves the next batch to begin on its own.
func (p *txPath[Tx]) commit(ctx context.Context, env *pathEnv, tx Tx, l *lane) (chained bool, err error) {
	if !p.caps.CommitChain || l == nil {
		return false, p.drv.Commit(ctx, tx)
	}
	if !settlesQuietly(l.cur) {
		// Settling this batch publishes a retry or a dead letter: a
		// transaction chained now would idle through that broker I/O,
		// and a server's idle_in_transaction_session_timeout would kill
		// it under the next batch's first message.
		return false, p.drv.Commit(ctx, tx)
	}
	next := env.takeAhead(ctx, l)
	if next == nil || len(next.live) == 0 {
		return false, p.drv.Commit(ctx, tx)
	}
	o := &openTx[Tx]{drv: p.drv, jobs: next.live, tx: tx}
	var (
		claims    []dedup.Claim
		committed bool
	)
	o.timed(env, func() { claims, committed, err = p.drv.CommitChain(ctx, tx, env.scope, dedupRecords(next.live)) })
	switch {
	case err == nil:
		o.claims = claims
		l.chain = o
		return true, nil
	case committed:
		env.log.DebugContext(ctx, "claim chained to a commit failed; the next batch begins its own transaction", LogKeyError, err)
		return false, nil
	default:
		return false, err
	}
}

// settlesQuietly reports whether settling b, once the transaction being
// committed succeeds, takes no broker call but the coalesced
// acknowledgements, which the lane's acker sends off its path: every job is
// acknowledged (committed, a duplicate, or a follower of a committed leader
// with the same payload), none is retried or dead-lettered. A job without
// an outcome at this point is in the transaction being committed. Without
// a batch (nil) it reports false.
func settlesQuietly(b *prepared) bool {
	if b == nil {
		return false
	}
	for _, j := range b.batch {
		switch j.out {
		case outNone, outAck, outDuplicate:
		default:
			return false
		}
		if j.follower {
			if leader := b.leaders[j.key]; leader == nil || leader.hash != j.hash {
				return false
			}
		}
	}
	return true
}

// beginClaim begins a transaction and claims recs in it, in one round trip
// where the store can pipeline them. On an error no transaction is open.
func (p *txPath[Tx]) beginClaim(ctx context.Context, scope string, recs []dedup.Record) (Tx, []dedup.Claim, error) {
	if p.caps.BeginClaim {
		tx, claims, err := p.drv.BeginClaim(ctx, scope, recs)
		if err != nil {
			return tx, nil, fmt.Errorf("idemq: begin and claim: %w", err)
		}
		return tx, claims, nil
	}
	tx, err := p.drv.Begin(ctx)
	if err != nil {
		return tx, nil, fmt.Errorf("idemq: begin: %w", err)
	}
	claims, err := p.drv.Claim(ctx, tx, scope, recs)
	if err != nil {
		_ = p.drv.Rollback(context.WithoutCancel(ctx), tx)
		return tx, nil, fmt.Errorf("idemq: claim: %w", err)
	}
	return tx, claims, nil
}

// handle runs the handlers of the new messages in tx. failed reports that
// the transaction must be rolled back, with res saying why.
func (p *txPath[Tx]) handle(ctx context.Context, env *pathEnv, tx Tx, fresh []*job, ti *TxInfo) (res tryResult, failed bool) {
	if p.bh != nil {
		return p.handleBatch(ctx, env, tx, fresh, ti)
	}
	for i, j := range fresh {
		// env.go: resultErr refuses a result above Config.MaxResultBytes.
		err := env.call(ctx, j, func(ctx context.Context) error { return env.resultErr(j, p.h(ctx, tx, j.msg)) })
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
func (p *txPath[Tx]) blame(ctx context.Context, env *pathEnv, held *heldPartitions, j *job, err error) {
	if p.handlerTransient(err) {
		j.set(outRetryInfra, err)
		j.delay = env.infraDelay()
	} else {
		env.failure(j, err)
	}
	env.log.DebugContext(ctx, "handler failed", LogKeyKey, j.key, LogKeyAttempt, j.msg.Attempt, LogKeyError, err)
	held.hold(j)
}

// infra settles the unsettled jobs of a transaction that failed for a reason
// of the store or the database (begin, claim or commit): nothing in it is
// durable, and nothing is counted against the messages. Their partitions are
// held, so that when jobs is a half of a bisected batch, the later messages
// of those partitions in the other half do not commit ahead of them.
func (p *txPath[Tx]) infra(ctx context.Context, env *pathEnv, held *heldPartitions, jobs []*job, err error) {
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
		if !held.has(j.msg.PartitionKey) {
			held.hold(j) // the first of its partition: the later ones wait
		}
		n++
	}
	env.storeOut.warn(ctx, env.log, "transaction failed; its messages will be retried", slog.Int(LogKeyCount, n), slog.Any(LogKeyError, err))
}

// driverCaps returns the capabilities of the path's store.
func (p *txPath[Tx]) driverCaps() dedupdriver.Caps { return p.caps }

// driver returns the path's store driver as a failure counter.
func (p *txPath[Tx]) driver() dedupdriver.Common { return p.drv }

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
