package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/internal/cfgerr"
)

// LeaseOptions configures the lease path.
type LeaseOptions struct {
	// Lease is how long a claim stays valid without a refresh. A worker that
	// crashes holds the key this long. Defaults to 30 s.
	Lease time.Duration
	// RefreshInterval is how often the lease is extended while the handler
	// runs; it must be below Lease/2. It is also the safety margin: a lease
	// with no refresh confirmed for Lease minus RefreshInterval is taken as
	// lost (its handler's context is cancelled). Defaults to Lease/3. Negative disables
	// refreshing: a handler slower than Lease then loses its key to another
	// worker and its outcome is not recorded.
	RefreshInterval time.Duration
	// Retention is how long a completed key is remembered. Defaults to
	// dedup.DefaultRetention (8 days).
	Retention time.Duration
	// InProgressDelay is the retry delay for a message whose key another
	// worker is handling right now. Defaults to Lease/2.
	InProgressDelay time.Duration
}

// WithDefaults returns a copy of o with every zero field set to its default.
func (o LeaseOptions) WithDefaults() LeaseOptions {
	o.Lease = cmp.Or(o.Lease, 30*time.Second)
	o.RefreshInterval = cmp.Or(o.RefreshInterval, o.Lease/3)
	o.Retention = cmp.Or(o.Retention, dedup.DefaultRetention)
	o.InProgressDelay = cmp.Or(o.InProgressDelay, o.Lease/2)
	return o
}

// Leased returns the path for effects outside a database. store is a
// redisdedup.Store, or anything else whose Driver returns a
// dedupdriver.Lease. For each message
// the runner claims the key in store with a fresh token, runs the handler while
// refreshing the lease, marks the key done, and only then acknowledges. A key
// already done is acknowledged without running the handler; a key another
// worker holds is neither run nor acknowledged but retried later, so
// duplicates never run concurrently. If a refresh finds the lease lost, or
// no refresh has been confirmed for Lease minus RefreshInterval (refreshes
// time out or hang on a stalled connection), the handler's context is
// cancelled, with a cause matching dedup.ErrLeaseLost, before the lease can
// have expired, and its outcome is not marked done.
//
// With Config.BatchSize above 1 and a store that implements
// dedupdriver.Caps.BatchClaim (dedup/redisdedup does), the keys of a batch are claimed
// in one round trip and the leases of the messages waiting their turn are
// refreshed until their handler starts; each key is still marked done right
// after its own effect, so batching does not widen the window below. A queued
// message never runs under a lease that may have expired: if its refreshes
// failed for longer than Lease minus RefreshInterval, its key is claimed
// again under the same token first, and the message runs only if that claim
// is granted; if a refresh of its lease is in flight when its turn comes,
// the runner waits for it, and a lease it finds lost is not used.
//
// Duplicate window: a crash after the effect and before the key is marked
// done lets the effect run again once the lease expires. Forward IdempotencyKey to
// the downstream system so that it deduplicates that repetition.
func Leased(store dedupdriver.LeaseStore, h Handler, opts LeaseOptions) Path {
	return &leasePath{pathStore: newPathStore[dedupdriver.Lease](store), h: h, opts: opts.WithDefaults()}
}

// leasePath is the lease path, over the driver of store and its
// capabilities.
type leasePath struct {
	pathStore[dedupdriver.Lease]
	h    Handler
	opts LeaseOptions
}

func (p *leasePath) process(ctx context.Context, env *pathEnv, batch []*job, l *lane) {
	q := claimQueued(ctx, env, p.drv, p.caps, p.opts.Lease, p.opts.RefreshInterval, batch)
	defer q.stop()
	l.order.inTurn(batch, func(i int, j *job, held bool) {
		pc := q.take(i)
		if !held {
			p.one(ctx, env, j, pc)
		} else if pc != nil && pc.ok && pc.claim.State == dedup.StateNew && pc.lost == nil {
			p.abandonLease(ctx, env, j.key, pc.token)
		}
	})
}

func (p *leasePath) abandonLease(ctx context.Context, env *pathEnv, key, token string) {
	if err := p.drv.Abandon(ctx, env.scope, key, token); err != nil {
		env.storeOut.line(ctx, env.log, slog.LevelWarn, "abandoning the lease failed; it expires by itself",
			slog.String(LogKeyKey, key), slog.Any(LogKeyError, err))
	}
}

// claim returns the claim of j: the one made for its batch while its lease
// is known to last (safeUntil), else a new one under the same token, which
// is StateNew only if this token still holds the key or nobody took it
// meanwhile.
func (p *leasePath) claim(ctx context.Context, env *pathEnv, j *job, pc *preclaim) (token string, c dedup.Claim, confirmed time.Time, err error) {
	if pc != nil && pc.ok {
		if pc.lost != nil {
			return pc.token, pc.claim, pc.confirmed, fmt.Errorf("idemq: lease of key %q lost while queued: %w", j.key, pc.lost)
		}
		if pc.claim.State != dedup.StateNew || time.Now().Before(p.safeUntil(pc.confirmed)) {
			return pc.token, pc.claim, pc.confirmed, nil
		}
		env.log.LogAttrs(ctx, slog.LevelDebug, "lease of a queued message may have expired; claiming it again",
			slog.String(LogKeyKey, j.key), slog.Duration("since_confirmed", time.Since(pc.confirmed)))
	}
	token = newToken()
	if pc != nil {
		token = pc.token // the failed batch claim may hold the key with it
	}
	confirmed = time.Now()
	c, err = p.drv.Claim(ctx, env.scope, dedup.Record{Key: j.key, PayloadHash: j.hash}, token, p.opts.Lease)
	if err != nil {
		return token, c, confirmed, fmt.Errorf("idemq: claim lease: %w", err)
	}
	return token, c, confirmed, nil
}

// safeUntil is the one rule for how long a lease may be relied on: until
// Lease minus RefreshInterval (the safety margin) after the last claim or
// refresh the store confirmed was sent. A queued message whose lease is
// older is claimed again before it runs; a running handler whose lease is
// older has its context cancelled, whatever the refreshes failed with (lost
// lease, timeout, stalled connection).
func (p *leasePath) safeUntil(confirmed time.Time) time.Time {
	return confirmed.Add(p.opts.Lease - p.opts.RefreshInterval)
}

// one claims j's key (with pc, its batch claim, or nil), runs j when the
// key is new, and settles it.
func (p *leasePath) one(ctx context.Context, env *pathEnv, j *job, pc *preclaim) {
	var r leaseRun
	r.claimStart = env.obs.now()
	token, c, confirmed, err := p.claim(ctx, env, j, pc)
	r.claimEnd = env.obs.now()
	r.claim, r.claimErr = c, err
	if err == nil {
		env.infraOK()
		if c.State == dedup.StateNew {
			p.run(ctx, env, j, token, confirmed, &r)
		}
	}
	p.settleLease(env, j, &r)
}

// leaseRun is what happened to one message on the lease path, for
// settleLease, which tells the hooks at one point.
type leaseRun struct {
	claim                dedup.Claim
	claimErr             error
	claimStart, claimEnd time.Time  // zero when nothing is timed (observer.now)
	err                  error      // the handler's
	cerr                 error      // marking the key done
	commit               CommitInfo // marking the key done; zero when nothing is timed
	lost                 error      // why the lease was lost while the handler ran
	lostEv               error      // a lease lost, queued or handling, for HookLeaseLost
}

// run runs j's handler under the lease of token, marks the key done if it
// succeeded or abandons the lease if it failed, and records it in r.
func (p *leasePath) run(ctx context.Context, env *pathEnv, j *job, token string, confirmed time.Time, r *leaseRun) {
	hctx, cancel := context.WithCancelCause(context.WithValue(ctx, ctxKeyToken, token))
	defer cancel(nil)
	stop := p.refresh(hctx, env, cancel, j.key, token, confirmed)
	r.err = env.call(hctx, j, func(ctx context.Context) error { return p.h(ctx, j.msg) })
	if r.err == nil {
		v, rerr := env.checkResult(j)
		if rerr != nil && j.msg.res.err == nil {
			j.msg.res.err = rerr
		}
		// The lease is still refreshed while the key is marked done.
		start := env.obs.now()
		r.cerr = p.complete(ctx, env, j, token, v)
		r.commit = commitInfo(start, 1, r.cerr)
	}
	r.lost = stop()
	if r.err != nil && r.lost == nil {
		p.abandonLease(ctx, env, j.key, token)
	}
}

// complete marks key done under token, with the result v when there is
// one, retrying a store that fails for up to one lease: an effect that
// happened must not be repeated because Redis hiccuped. It gives up at once
// when the lease is lost.
func (p *leasePath) complete(ctx context.Context, env *pathEnv, j *job, token string, v []byte) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.Lease)
	defer cancel()
	delay := 10 * time.Millisecond
	for {
		err := p.completeKey(ctx, env, j, token, v)
		if err == nil || errors.Is(err, dedup.ErrLeaseLost) {
			env.storeOut.ok(ctx, env.log)
			return err
		}
		env.storeOut.failed(ctx, env.log, fmt.Errorf("idemq: mark key done: %w", err))
		env.storeOut.line(ctx, env.log, slog.LevelWarn, "marking key done failed; retrying",
			slog.String(LogKeyKey, j.key), slog.Duration(LogKeyDelay, delay), slog.Any(LogKeyError, err))
		if sleep(ctx, delay); ctx.Err() != nil {
			return fmt.Errorf("%w (gave up after one lease: %w)", err, ctx.Err())
		}
		delay = min(2*delay, time.Second)
	}
}

// completeKey marks j's key done under token on the lease path, with the
// result v its handler returned when there is one and the store keeps
// results. A result the runner or the store refuses (too large, or a store
// without results) is left out, the key is marked done all the same (the
// effect happened and must not be repeated), and settleLease dead-letters
// the message.
func (p *leasePath) completeKey(ctx context.Context, env *pathEnv, j *job, token string, v []byte) error {
	if v != nil && j.msg.res.err == nil {
		if !p.caps.Results {
			j.msg.res.err = Permanent(fmt.Errorf("%w: %T keeps no results", ErrResultUnsupported, p.store))
		} else {
			err := p.drv.CompleteWithResult(ctx, env.scope, j.key, token, p.opts.Retention, v)
			if !errors.Is(err, dedup.ErrResultTooLarge) && !errors.Is(err, ErrResultUnsupported) && !errors.Is(err, dedupdriver.ErrUnsupported) {
				return err
			}
			j.msg.res.err = Permanent(err)
		}
	}
	return p.drv.Complete(ctx, env.scope, j.key, token, p.opts.Retention)
}

// settleLease gives j its outcome from r, then tells the hooks what
// happened, and then marks j handled (StoredResult) if it was, in the
// order of the transactional path.
func (p *leasePath) settleLease(env *pathEnv, j *job, r *leaseRun) {
	switch {
	case r.claimErr != nil:
		j.set(outRetryInfra, r.claimErr)
		if errors.Is(r.claimErr, dedup.ErrLeaseLost) {
			j.delay, r.lostEv = p.opts.InProgressDelay, r.claimErr
		} else {
			j.delay = env.infraDelay()
		}
	case r.claim.State == dedup.StateDone:
		j.set(outDuplicate, nil)
		j.replay(r.claim.Result) // the stored result, for StoredResult
	case r.claim.State == dedup.StateMismatch:
		j.set(outDeadLetter, &dedup.MismatchError{Scope: env.scope, Key: j.key, Stored: r.claim.StoredHash, Received: j.hash})
	case r.claim.State == dedup.StateInProgress:
		j.set(outRetryInfra, fmt.Errorf("idemq: key %q: %w", j.key, ErrKeyBusy))
		j.delay = p.opts.InProgressDelay
	case r.claim.State != dedup.StateNew:
		j.set(outRetryInfra, fmt.Errorf("idemq: claim of key %q returned state %v", j.key, r.claim.State))
	case r.err == nil && r.cerr == nil:
		if rerr := j.msg.res.err; rerr != nil {
			j.msg.setReturned(nil, false)
			j.set(outDeadLetter, rerr)
		} else {
			j.set(outAck, nil)
		}
	case r.err == nil:
		// The effect happened but is not recorded (the lease was lost, or
		// the store stayed unreachable): the retry finds out whether
		// another worker completed the key.
		j.set(outRetryInfra, fmt.Errorf("idemq: mark key %q done: %w", j.key, r.cerr))
		j.delay = p.opts.InProgressDelay
	case r.lost != nil:
		// Another worker may own the key now: record nothing under this
		// token and let the retry find out what happened.
		j.set(outRetryInfra, fmt.Errorf("idemq: lease of key %q lost while handling: %w", j.key, r.lost))
		j.delay, r.lostEv = p.opts.InProgressDelay, r.lost
	default:
		env.failure(j, r.err)
	}
	env.obs.noteClaim(j, r.claimStart, r.claimEnd, 1, r.claimErr == nil && r.claim.State == dedup.StateNew)
	if !r.commit.Start.IsZero() {
		env.obs.onCommit([]*job{j}, r.commit)
	}
	if r.lostEv != nil {
		for _, h := range env.obs.leaseLost {
			h.OnLeaseLost(j.ctx, j.msg, r.lostEv)
		}
	}
	if j.out == outAck {
		j.handled()
	}
}

func (p *leasePath) validate() error {
	var l cfgerr.List
	o := p.opts
	p.pathStore.validate(&l, "Leased")
	if p.h == nil {
		l.Add("Leased handler", "nil")
	}
	if o.Lease <= 0 {
		l.Add("LeaseOptions.Lease", "must be positive")
	} else if o.RefreshInterval >= 0 && 2*o.RefreshInterval >= o.Lease {
		l.Add("LeaseOptions.RefreshInterval", "must be below half the lease (or negative to disable refreshing)")
	}
	if o.Retention < time.Second {
		l.Add("LeaseOptions.Retention", "must be at least 1s")
	}
	if o.InProgressDelay < 0 {
		l.Add("LeaseOptions.InProgressDelay", "must not be negative")
	}
	return l.Err()
}

// refresh extends the lease every RefreshInterval until the returned stop
// function is called. confirmed is when the claim the store confirmed was
// sent. If a refresh finds the lease lost, or no refresh has been confirmed
// by safeUntil (refreshes fail or hang), it cancels the handler's context
// with a cause matching dedup.ErrLeaseLost; stop then returns that cause.
func (p *leasePath) refresh(ctx context.Context, env *pathEnv, cancel context.CancelCauseFunc, key, token string, confirmed time.Time) (stop func() error) {
	if p.opts.RefreshInterval < 0 {
		return func() error { return nil }
	}
	var (
		mu      sync.Mutex
		lastErr error // the last refresh error since the last confirmation
		expired error // set when the watchdog cancelled the handler
	)
	watchdog := time.AfterFunc(time.Until(p.safeUntil(confirmed)), func() {
		mu.Lock()
		why := "a refresh is still in flight"
		if lastErr != nil {
			why = "last refresh error: " + lastErr.Error()
		}
		expired = fmt.Errorf("%w: no refresh confirmed within %v of the last one (%s)",
			dedup.ErrLeaseLost, p.opts.Lease-p.opts.RefreshInterval, why)
		mu.Unlock()
		cancel(expired)
	})
	done := make(chan struct{})
	result := make(chan error, 1)
	go func() {
		t := time.NewTicker(p.opts.RefreshInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				result <- nil
				return
			case <-t.C:
				sent := time.Now()
				err := p.drv.Refresh(ctx, env.scope, key, token, p.opts.Lease)
				if errors.Is(err, dedup.ErrLeaseLost) {
					cancel(err)
					result <- err
					return
				}
				mu.Lock()
				if err == nil && expired == nil {
					watchdog.Reset(time.Until(p.safeUntil(sent)))
				}
				lastErr = err
				mu.Unlock()
				if err != nil && ctx.Err() == nil {
					env.storeOut.failed(ctx, env.log, fmt.Errorf("idemq: refresh lease: %w", err))
					env.obs.onRefreshFailed(ctx, err)
				} else if err == nil {
					env.storeOut.ok(ctx, env.log)
				}
				// Other errors (store briefly unreachable) are retried on
				// the next tick; the watchdog cancels the handler before
				// the lease can have expired, and Complete checks the
				// token at the end.
			}
		}
	}()
	return func() error {
		close(done)
		err := <-result
		watchdog.Stop()
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			err = expired
		}
		return err
	}
}

// poolSize is 0: the lease path holds no connection across a handler.
func (p *leasePath) poolSize() int { return 0 }

func (p *leasePath) retention() (time.Duration, bool) { return p.opts.Retention, true }
