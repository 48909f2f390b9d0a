package consumer

import (
	"context"
	"time"
)

// clock reads the time for the hooks that report when a claim, a commit or
// a transaction happened (HookClaimed, HookCommit, HookTx): it is the one
// switch of the paths' timing. Without such hooks it reads the zero time, at
// no cost.
type clock bool

// clock returns the clock of the paths' timing: on when a hook reports
// when a claim, a commit or a transaction happened.
func (obs *observer) clock() clock {
	return clock(obs.claims != nil || len(obs.tx) > 0 || len(obs.commit) > 0)
}

// now returns the time, or the zero time when nothing is timed.
func (c clock) now() time.Time {
	if !c {
		return time.Time{}
	}
	return time.Now()
}

// noteClaim records the claim of j's key, from start to end, together
// with n keys, as new or not; a later claim of j replaces it. It does
// nothing without HookClaimed hooks.
func (obs *observer) noteClaim(j *job, start, end time.Time, n int, isNew bool) {
	if obs.claims == nil {
		return
	}
	obs.claims.mu.Lock()
	obs.claims.m[j] = claimRecord{start: start, end: end, n: n, isNew: isNew}
	obs.claims.mu.Unlock()
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

// onTx reports a transaction to the HookTx hooks.
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

// leaseEvents is what the hooks hear of one message of the lease path,
// told at one point (onLease) before the message gets its outcome.
type leaseEvents struct {
	claimStart, claimEnd time.Time // zero when nothing is timed (clock)
	claimNew             bool
	commit               CommitInfo // marking the key done; zero when nothing is timed
	lost                 error      // its lease was lost (queued or handling)
}

// onLease records the claim of j for the HookClaimed hooks and reports the
// marking of its key done and a lost lease to their hooks.
func (obs *observer) onLease(j *job, ev *leaseEvents) {
	if !ev.claimStart.IsZero() {
		obs.noteClaim(j, ev.claimStart, ev.claimEnd, 1, ev.claimNew)
	}
	if !ev.commit.Start.IsZero() {
		obs.onCommit([]*job{j}, ev.commit)
	}
	if ev.lost != nil {
		for _, h := range obs.leaseLost {
			h.OnLeaseLost(j.ctx, j.msg, ev.lost)
		}
	}
}
