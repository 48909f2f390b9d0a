package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// settler settles the jobs of a batch once its path is done: it hands back
// (Source.Retry or Releaser.Release) or dead-letters the failed ones and
// returns those to acknowledge, which the lane's acker sends (Source.Ack).
// It is built once in NewRunner and is safe for concurrent use by the lanes.
type settler struct {
	env *pathEnv
	src Source
	out *outage // the Retry, Release and DeadLetter calls' run of failures
	// counter is the path's store's handler-failure counter, or nil (the
	// broker's attempt count applies).
	counter dedupdriver.Common
}

// settle settles a prepared batch whose path is done: it reports the
// store's trouble (Health), settles the later copies of a key after their
// leader, hands back (retry, release) or dead-letters the failed jobs, and
// returns those to acknowledge, for the lane's acker. Once ctx is cancelled
// (the drain timed out) nothing is retried or dead-lettered: a handler cut
// short by the shutdown did not fail, so its message is left to the broker
// without counting an attempt. A job dead-lettered ends with outDeadLetter.
func (s *settler) settle(ctx context.Context, b *prepared) (acks []*job) {
	if len(b.live) > 0 {
		s.env.storeOut.report(ctx, s.env.log, infraErr(b.live))
	}
	s.followLeaders(b)
	obs, log, stats := s.env.obs, s.env.log, s.env.stats
	for _, j := range b.batch {
		obs.onClaimed(j)
		switch j.out {
		case outAck:
			stats.handled.Add(1)
			acks = append(acks, j)
			continue
		case outNone:
			obs.onSettled(j, OutcomeLeft, len(b.batch), nil)
			continue
		}
		mctx := s.env.msgCtx(ctx, j)
		switch {
		case j.out == outDuplicate:
			stats.duplicates.Add(1)
			log.LogAttrs(mctx, slog.LevelDebug, "duplicate acknowledged",
				slog.String(LogKeyKey, j.key), slog.String(LogKeyID, j.msg.ID), slog.Int(LogKeyAttempt, j.msg.Attempt))
			acks = append(acks, j)
		case ctx.Err() != nil:
			stats.left.Add(1)
			log.LogAttrs(mctx, slog.LevelInfo, "stopping: message left to the broker",
				append([]slog.Attr{slog.String(LogKeyKey, j.key), slog.String(LogKeyID, j.msg.ID), slog.Int(LogKeyAttempt, j.msg.Attempt),
					slog.Any(LogKeyError, j.err)}, panicStack(j.err)...)...)
			obs.onSettled(j, OutcomeLeft, len(b.batch), j.err)
		default: // outRetry, outRetryInfra, outDeadLetter
			o := s.settleFailed(mctx, j)
			obs.onSettled(j, o, len(b.batch), j.err)
		}
	}
	return acks
}

// panicStack returns the LogKeyStack attribute of the panic err wraps
// (a *PanicError), or nothing.
func panicStack(err error) []slog.Attr {
	var p *PanicError
	if !errors.As(err, &p) || len(p.Stack) == 0 {
		return nil
	}
	return []slog.Attr{slog.String(LogKeyStack, string(p.Stack))}
}

// errDuplicateUnsettled is wrapped by the retry reason of a later copy of a
// key in a batch whose first copy was not settled.
var errDuplicateUnsettled = errors.New("first copy not settled")

// infraErr returns the error of the first job of batch that the store's
// trouble sent back, for the outage log. Jobs sent back for reasons of their
// own (another worker holds the key, an unsettled copy in the batch) are not
// the store's trouble.
func infraErr(batch []*job) error {
	for _, j := range batch {
		if storeTrouble(j) {
			return j.err
		}
	}
	return nil
}

// storeTrouble reports whether j was sent back for the store's trouble:
// not for a reason of its own (another worker holds the key, an unsettled
// copy in the batch).
func storeTrouble(j *job) bool {
	return j.out == outRetryInfra && j.err != nil && !errors.Is(j.err, ErrKeyBusy) && !errors.Is(j.err, errDuplicateUnsettled)
}

// followLeaders gives each later copy of a key in b its outcome from its
// leader's: retried after it when the leader was not settled,
// dead-lettered when its payload differs, else a duplicate with the
// leader's result (for StoredResult).
func (s *settler) followLeaders(b *prepared) {
	for _, f := range b.followers {
		leader := b.leaders[f.key]
		switch {
		case leader.out != outAck && leader.out != outDuplicate:
			f.set(outRetryInfra, fmt.Errorf("idemq: duplicate of key %q in the same batch is retried after its first copy: %w", f.key, errDuplicateUnsettled))
		case f.hash != leader.hash:
			f.set(outDeadLetter, &dedup.MismatchError{Scope: s.env.scope, Key: f.key, Stored: leader.hash, Received: f.hash})
		default:
			f.set(outDuplicate, nil)
			v, _, _ := StoredResult(leader.msg)
			f.replay(v)
		}
	}
}

// settleFailed dead-letters j when it is poison or out of attempts, else
// hands it back and returns the outcome: Source.Retry for a handler failure
// (a counted attempt), Releaser.Release, where the source has it, for a
// failure that is not the message's (outRetryInfra). ctx is the message's
// (see pathEnv.msgCtx).
func (s *settler) settleFailed(ctx context.Context, j *job) Outcome {
	m := j.msg
	var delay time.Duration
	kind := RetryHandler
	switch {
	case j.out == outRetryInfra:
		// Not the message's fault: never dead-letter for it.
		delay = j.delay
		if delay <= 0 {
			delay = s.env.retry.Backoff(1)
		}
		kind = RetryInfrastructure
	case j.out == outRetry && s.countFailure(ctx, j) < s.env.retry.MaxAttempts:
		delay = s.env.backoff(j)
	default: // poison, or out of attempts
		cause := j.err
		if j.out == outRetry {
			cause = &exhaustedError{attempts: j.attempt(), err: j.err}
		}
		return s.deadLetter(ctx, j, cause)
	}
	attrs := append([]slog.Attr{slog.String(LogKeyKey, j.key), slog.String(LogKeyID, m.ID),
		slog.String(LogKeyQueue, m.Topic), slog.Int(LogKeyAttempt, j.attempt()), slog.Duration(LogKeyDelay, delay),
		slog.Any(LogKeyError, j.err)}, panicStack(j.err)...)
	switch {
	case storeTrouble(j):
		// Once the store's outage is reported, its lines speak for the
		// messages it sends back: not one line per message and retry.
		s.env.storeOut.line(ctx, s.env.log, slog.LevelInfo, "message will be retried", attrs...)
	case errors.Is(j.err, ErrHandlerPanic):
		s.env.log.LogAttrs(ctx, slog.LevelError, "message will be retried: handler panicked", attrs...)
	default:
		s.env.log.LogAttrs(ctx, slog.LevelInfo, "message will be retried", attrs...)
	}
	s.env.obs.onRetry(j, kind, delay)
	var err error
	if rel, ok := s.src.(Releaser); ok && j.out == outRetryInfra {
		err = rel.Release(ctx, m, delay, j.err)
	} else {
		err = s.src.Retry(ctx, m, delay)
	}
	if err != nil {
		s.env.stats.left.Add(1)
		if errors.Is(err, ErrFenced) { // the partition's new owner settles it
			return OutcomeLeft
		}
		s.env.stats.settleFailures.Add(1)
		s.out.failed(ctx, s.env.log, err)
		s.out.line(ctx, s.env.log, slog.LevelWarn, "retry failed; the broker will redeliver", slog.String(LogKeyID, m.ID), slog.Any(LogKeyError, err))
		return OutcomeLeft
	}
	s.env.stats.retried.Add(1)
	s.out.ok(ctx, s.env.log)
	return OutcomeRetried
}

// deadLetter hands j to the source's dead-letter route. Only a dead letter
// the source accepted is counted and logged as one. It returns the outcome.
// ctx is the message's (see pathEnv.msgCtx).
func (s *settler) deadLetter(ctx context.Context, j *job, cause error) Outcome {
	m := j.msg
	reason := &DeadLetterError{Key: j.key, Attempts: j.attempt(), Err: cause}
	attrs := append([]slog.Attr{slog.String(LogKeyKey, j.key), slog.String(LogKeyID, m.ID), slog.String(LogKeyQueue, m.Topic),
		slog.Int(LogKeyAttempt, j.attempt()), slog.Any(LogKeyError, cause)}, panicStack(cause)...)
	var mm *dedup.MismatchError
	if errors.As(cause, &mm) {
		attrs = append(attrs, slog.String(LogKeyStored, mm.Stored.String()), slog.String(LogKeyReceived, mm.Received.String()))
	}
	if err := s.src.DeadLetter(ctx, m, reason); err != nil {
		s.env.stats.left.Add(1)
		if errors.Is(err, ErrFenced) { // the partition's new owner settles it
			return OutcomeLeft
		}
		s.env.stats.settleFailures.Add(1)
		s.out.failed(ctx, s.env.log, err)
		s.out.line(ctx, s.env.log, slog.LevelError, "dead-letter failed; the broker will redeliver",
			append(attrs, slog.Any(LogKeySettleError, err))...)
		return OutcomeLeft
	}
	j.out = outDeadLetter // out of attempts: not handed back (order.settled)
	s.env.stats.deadLettered.Add(1)
	s.out.ok(ctx, s.env.log)
	if errors.Is(cause, ErrPayloadMismatch) {
		s.env.stats.mismatches.Add(1)
	}
	s.env.log.LogAttrs(ctx, slog.LevelError, "message dead-lettered", attrs...)
	s.forgetFailures(ctx, j)
	s.env.obs.onDeadLetter(j, cause)
	return OutcomeDeadLettered
}

// failureCountTimeout bounds the call that counts a handler failure, so that
// an unreachable store delays the retry decision by at most this much before
// the runner falls back to the broker's attempt count.
const failureCountTimeout = 5 * time.Second

// countFailure records the handler failure of j in the path's store and sets
// j.failures to the key's count, which the retry policy uses instead of the
// broker's (see RetryPolicy.MaxAttempts). It runs once per handler failure,
// after the failed transaction: the happy path never pays for it. Without a
// counter, or when counting fails, j keeps the broker's count and the
// failure to count is logged. It returns j.attempt().
func (s *settler) countFailure(ctx context.Context, j *job) int {
	if s.counter == nil {
		return j.attempt()
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failureCountTimeout)
	defer cancel()
	n, err := s.counter.RecordFailure(cctx, s.env.scope, dedup.Record{Key: j.key, PayloadHash: j.hash})
	if err != nil || n < 1 {
		s.env.log.LogAttrs(ctx, slog.LevelWarn, "counting the handler failure failed; using the broker's attempt count",
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
func (s *settler) forgetFailures(ctx context.Context, j *job) {
	if s.counter == nil || j.failures == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failureCountTimeout)
	defer cancel()
	if err := s.counter.ForgetFailures(cctx, s.env.scope, j.key); err != nil {
		s.env.log.LogAttrs(ctx, slog.LevelWarn, "forgetting the failure count of a dead-lettered message failed; it expires with the store's retention",
			slog.String(LogKeyKey, j.key), slog.String(LogKeyID, j.msg.ID), slog.Any(LogKeyError, err))
	}
}
