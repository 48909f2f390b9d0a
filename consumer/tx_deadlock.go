package consumer

import (
	"context"
)

// runEach settles every job of jobs one message per transaction, in order,
// after their transaction failed on a lock conflict (see conflicted): no
// attempt is counted for that failure. A message that fails on its own is
// blamed as in runAll (a conflict again is retried without counting an
// attempt), and the later messages of its partition are held behind it. A
// failure of the store that is no lock conflict settles the rest as runAll
// does. No commit is chained: the lane's next batch begins its own
// transaction, at full size.
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
