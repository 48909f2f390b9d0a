package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemq/idemq/dedup"
)

// failureCountTimeout bounds the call that counts a handler failure, so that
// an unreachable store delays the retry decision by at most this much before
// the runner falls back to the broker's attempt count.
const failureCountTimeout = 5 * time.Second

// failureCounting is implemented by the paths whose store can count handler
// failures per key (dedup.FailureCounter).
type failureCounting interface {
	failureCounter() dedup.FailureCounter
}

// countFailure records the handler failure of j in the path's store and sets
// j.failures to the key's failure count, which the retry policy then uses
// instead of the broker's delivery count: deliveries to consumers that
// crashed or were killed are not the message's fault. It is called once per
// handler failure, after the failed transaction ended, and only then: the
// happy path never pays for it. Without a counter, or when counting fails
// (the store is down), j keeps the broker's count, and the failure to count
// is logged. It returns j.attempt().
func (r *Runner) countFailure(ctx context.Context, j *job) int {
	fc, ok := r.path.(failureCounting)
	if !ok || fc.failureCounter() == nil {
		return j.attempt()
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failureCountTimeout)
	defer cancel()
	n, err := fc.failureCounter().RecordFailure(cctx, r.cfg.Name, dedup.Record{Key: j.key, PayloadHash: j.hash})
	if err != nil || n < 1 {
		r.log.LogAttrs(ctx, slog.LevelWarn, "counting the handler failure failed; using the broker's attempt count",
			slog.String(LogKeyKey, j.key), slog.String(LogKeyID, j.msg.ID),
			slog.Int(LogKeyAttempt, j.msg.Attempt), slog.Any(LogKeyError, err))
		return j.attempt()
	}
	if n != j.msg.Attempt {
		j.delay = 0 // computed from the broker's count: compute it again
	}
	j.failures = n
	return n
}

// forgetFailures deletes the failure count of a job that was dead-lettered
// for exhausting its attempts, so that a replay of the dead letter starts
// with a fresh count. A failure to forget is only logged: the count expires
// with the store's retention.
func (r *Runner) forgetFailures(ctx context.Context, j *job) {
	fc, ok := r.path.(failureCounting)
	if !ok || fc.failureCounter() == nil || j.failures == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failureCountTimeout)
	defer cancel()
	if err := fc.failureCounter().ForgetFailures(cctx, r.cfg.Name, j.key); err != nil {
		r.log.LogAttrs(ctx, slog.LevelWarn, "forgetting the failure count of a dead-lettered message failed; it expires with the store's retention",
			slog.String(LogKeyKey, j.key), slog.String(LogKeyID, j.msg.ID), slog.Any(LogKeyError, err))
	}
}

// attempt is the attempt number the retry policy sees for j: its key's
// counted handler failures, else the broker's delivery count.
func (j *job) attempt() int {
	if j.failures > 0 {
		return j.failures
	}
	return j.msg.Attempt
}
