package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
)

// Handler handles one message whose effect happens outside a database
// transaction (an email, a webhook, a third-party API call). It should pass
// DedupKey(ctx) to the downstream system as an idempotency key. Returning an
// error releases the lease and retries the message (see Permanent and
// RetryAfter).
type Handler func(ctx context.Context, msg *Message) error

// LeaseOptions configures the lease path.
type LeaseOptions struct {
	// Lease is how long a claim stays valid without a refresh. A worker that
	// crashes holds the key this long. Defaults to 30 s.
	Lease time.Duration
	// RefreshInterval is how often the lease is extended while the handler
	// runs. Defaults to Lease/3. Negative disables refreshing: a handler
	// slower than Lease then loses its key to another worker and its
	// outcome is not recorded.
	RefreshInterval time.Duration
	// Retention is how long a completed key is remembered. Defaults to 72 h.
	Retention time.Duration
	// InProgressDelay is the retry delay for a message whose key another
	// worker is handling right now. Defaults to Lease/2.
	InProgressDelay time.Duration
}

// WithDefaults returns a copy of o with every zero field set to its default.
func (o LeaseOptions) WithDefaults() LeaseOptions {
	if o.Lease == 0 {
		o.Lease = 30 * time.Second
	}
	if o.RefreshInterval == 0 {
		o.RefreshInterval = o.Lease / 3
	}
	if o.Retention == 0 {
		o.Retention = dedup.DefaultRetention
	}
	if o.InProgressDelay == 0 {
		o.InProgressDelay = o.Lease / 2
	}
	return o
}

// Leased returns the path for effects outside a database. For each message
// the runner claims the key in store with a fresh token, runs the handler while
// refreshing the lease, marks the key done, and only then acknowledges. A key
// already done is acknowledged without running the handler; a key another
// worker holds is neither run nor acknowledged but retried later, so
// duplicates never run concurrently. If a refresh finds the lease lost, the
// handler's context is cancelled and its outcome is not marked done.
//
// Duplicate window: a crash after the effect and before the key is marked
// done lets the effect run again once the lease expires. Forward DedupKey to
// the downstream system so that it deduplicates that repetition.
func Leased(store dedup.LeaseStore, h Handler, opts LeaseOptions) Path {
	return &leasePath{store: store, h: h, opts: opts.WithDefaults()}
}

type leasePath struct {
	store dedup.LeaseStore
	h     Handler
	opts  LeaseOptions
}

func (p *leasePath) process(ctx context.Context, r *Runner, batch []*job) {
	var held heldPartitions
	for _, j := range batch {
		if held.holds(j) {
			continue
		}
		p.one(ctx, r, j)
		held.hold(j)
	}
}

func (p *leasePath) one(ctx context.Context, r *Runner, j *job) {
	scope := r.cfg.Name
	token := newToken()
	c, err := p.store.Claim(ctx, scope, dedup.Record{Key: j.key, PayloadHash: j.hash}, token, p.opts.Lease)
	if err != nil {
		j.set(outRetryInfra, fmt.Errorf("idemq: claim lease: %w", err))
		return
	}
	switch c.State {
	case dedup.StateDone:
		j.set(outDuplicate, nil)
		return
	case dedup.StateMismatch:
		j.set(outDeadLetter, &dedup.MismatchError{Scope: scope, Key: j.key, Stored: c.StoredHash, Received: j.hash})
		return
	case dedup.StateInProgress:
		j.set(outRetryInfra, fmt.Errorf("idemq: key %q is being handled by another worker", j.key))
		j.delay = p.opts.InProgressDelay
		return
	case dedup.StateNew:
	default:
		j.set(outRetryInfra, fmt.Errorf("idemq: claim of key %q returned state %v", j.key, c.State))
		return
	}

	hctx, cancel := context.WithCancelCause(context.WithValue(ctx, ctxKeyToken, token))
	defer cancel(nil)
	stop := p.refresh(hctx, cancel, scope, j.key, token)
	err = r.call(hctx, j, func(ctx context.Context) error { return p.h(ctx, j.msg) })
	lost := stop()

	switch {
	case lost != nil:
		// Another worker may own the key now: record nothing under this
		// token and let the retry find out what happened.
		j.set(outRetryInfra, fmt.Errorf("idemq: lease of key %q lost while handling: %w", j.key, lost))
	case err != nil:
		r.failure(j, err)
		if rerr := p.store.Release(ctx, scope, j.key, token); rerr != nil {
			r.log.Warn("release of lease failed; it expires by itself", LogKeyKey, j.key, LogKeyError, rerr)
		}
	default:
		if cerr := p.store.Complete(ctx, scope, j.key, token, p.opts.Retention); cerr != nil {
			j.set(outRetryInfra, fmt.Errorf("idemq: mark key %q done: %w", j.key, cerr))
			return
		}
		j.set(outAck, nil)
	}
}

// refresh extends the lease every RefreshInterval until the returned stop
// function is called. If the lease is lost it cancels the handler's context;
// stop then returns the reason.
func (p *leasePath) refresh(ctx context.Context, cancel context.CancelCauseFunc, scope, key, token string) (stop func() error) {
	if p.opts.RefreshInterval < 0 {
		return func() error { return nil }
	}
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
				err := p.store.Refresh(ctx, scope, key, token, p.opts.Lease)
				if errors.Is(err, dedup.ErrLeaseLost) {
					cancel(err)
					result <- err
					return
				}
				// Other errors (store briefly unreachable) are retried on
				// the next tick; Complete checks the token at the end.
			}
		}
	}()
	return func() error {
		close(done)
		return <-result
	}
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
