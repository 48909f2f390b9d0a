package consumer

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

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
// is timed for the hooks that report it (observer.now).
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
	o.start = env.obs.now()
	o.tx, o.claims, o.err = p.beginClaim(ctx, env.scope, dedupRecords(jobs))
	o.end = env.obs.now()
	return o
}

// commit commits tx. When the store can chain a commit and the lane has a
// next batch queued, the commit begins that batch's transaction and claims
// its keys in the same round trip; chained reports that tx is then open
// for it, in l.chain. err is the commit's: a failed claim after a commit
// only leaves the next batch to begin on its own.
func (p *txPath[Tx]) commit(ctx context.Context, env *pathEnv, tx Tx, l *lane) (chained bool, err error) {
	var next *prepared
	// Settling a batch that does not settle quietly publishes a retry or a
	// dead letter: a transaction chained now would idle through that
	// broker I/O, and a server's idle_in_transaction_session_timeout would
	// kill it under the next batch's first message.
	if p.caps.CommitChain && l != nil && settlesQuietly(l.cur) {
		next = env.takeAhead(ctx, l)
	}
	if next == nil || len(next.live) == 0 {
		return false, p.drv.Commit(ctx, tx)
	}
	o := &openTx[Tx]{drv: p.drv, jobs: next.live, tx: tx, start: env.obs.now()}
	claims, committed, err := p.drv.CommitChain(ctx, tx, env.scope, dedupRecords(next.live))
	o.claims, o.end = claims, env.obs.now()
	switch {
	case err == nil:
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
