package consumer

import (
	"context"
	"time"
)

// now returns the time when a hook reports when a claim, a commit or a
// transaction happened, else the zero time, at no cost.
func (obs *observer) now() time.Time {
	if !obs.timed {
		return time.Time{}
	}
	return time.Now()
}

// noteClaim records on j the claim of its key, from start to end, together
// with n keys, as new or not; a later claim of j replaces it. It does
// nothing without HookClaimed hooks.
func (obs *observer) noteClaim(j *job, start, end time.Time, n int, isNew bool) {
	if len(obs.claimed) > 0 {
		j.claim = claimRecord{start: start, end: end, n: n, isNew: isNew}
	}
}

// commitInfo returns the CommitInfo of a commit of n messages from start
// (zero when no hook wants it) to now.
func commitInfo(start time.Time, n int, err error) CommitInfo {
	if start.IsZero() {
		return CommitInfo{}
	}
	return CommitInfo{Start: start, End: time.Now(), Err: err, Messages: n}
}

// onCommit reports the commit c of jobs (one write: the same CommitInfo
// for each) to the HookCommit hooks.
func (obs *observer) onCommit(jobs []*job, c CommitInfo) {
	if len(obs.commit) == 0 {
		return
	}
	for _, j := range jobs {
		for _, h := range obs.commit {
			h.OnCommit(j.ctx, j.msg, c)
		}
	}
}

func (obs *observer) onTx(ctx context.Context, t *TxInfo) {
	for _, h := range obs.tx {
		h.OnTx(ctx, *t)
	}
}

// jobCtxs returns the message contexts of jobs (ctx for a job without one).
func jobCtxs(ctx context.Context, jobs []*job) []context.Context {
	cs := make([]context.Context, len(jobs))
	for i, j := range jobs {
		cs[i] = j.ctx
		if cs[i] == nil {
			cs[i] = ctx
		}
	}
	return cs
}
