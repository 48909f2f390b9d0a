package consumer

import (
	"context"
	"errors"
)

func (p *txPath[Tx]) process(ctx context.Context, env *pathEnv, batch []*job, l *lane) {
	p.runAll(ctx, env, &l.order, batch, l)
}

// runAll settles every job of jobs, in as many transactions as it takes:
// one on the happy path, one more per culprit found by its own error, a
// halving of the suspects for a failure that names no culprit, and smaller
// transactions after a lock conflict (see conflicted). With a lane
// (not while it searches for a culprit among suspects), a transaction may
// use the one chained for jobs and chain its commit to the lane's next
// batch; a successful transaction is always the last.
func (p *txPath[Tx]) runAll(ctx context.Context, env *pathEnv, ord *order, jobs []*job, l *lane) {
	for {
		jobs = ord.pending(jobs)
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
			p.runEach(ctx, env, ord, jobs)
			return
		case res.infra || (res.culprit == nil && len(res.suspects) == 0):
			p.infra(ctx, env, ord, jobs, res.err)
			return
		case res.culprit != nil:
			p.blame(ctx, env, ord, res.culprit, res.err)
		case len(res.suspects) == 1:
			p.blame(ctx, env, ord, res.suspects[0], res.err)
		default:
			// One of the suspects failed without saying so. Run the first
			// half on its own: it commits, or narrows the search; the
			// loop then takes the rest.
			env.log.DebugContext(ctx, "transaction failed without naming a message; splitting it",
				LogKeyCount, len(res.suspects), LogKeyError, res.err)
			p.runAll(ctx, env, ord, res.suspects[:len(res.suspects)/2], nil)
		}
	}
}

// runEach settles every job of jobs one message per transaction, in order,
// after their transaction failed on a lock conflict (see conflicted and
// Transactional). A message that fails on its own is blamed as in runAll;
// a failure of the store that is no lock conflict settles the rest as
// runAll does. No commit is chained.
func (p *txPath[Tx]) runEach(ctx context.Context, env *pathEnv, ord *order, jobs []*job) {
	for {
		// A failed job stays first in jobs until this call, which holds
		// the later jobs of its partition and drops it.
		jobs = ord.pending(jobs)
		if len(jobs) == 0 {
			return
		}
		res := p.try(ctx, env, jobs[:1], nil)
		switch {
		case res.err == nil:
			env.infraOK()
		case res.culprit != nil || len(res.suspects) > 0:
			// The message failed on its own (its culprit or only suspect).
			p.blame(ctx, env, ord, jobs[0], res.err)
		case p.conflicted(res.err):
			p.infra(ctx, env, ord, jobs[:1], res.err) // its commit
		default:
			p.infra(ctx, env, ord, jobs, res.err)
			return
		}
	}
}
