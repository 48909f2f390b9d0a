package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// preclaim is the claim of one message made for its whole batch.
type preclaim struct {
	token string
	claim dedup.Claim
	ok    bool  // false: the batch claim failed; claim again with token
	lost  error // the lease was lost while the message waited its turn
	// confirmed is when the last claim or refresh that the store confirmed
	// was sent: the lease runs at least until confirmed + Lease.
	confirmed time.Time
}

// queuedLeases holds the claims of a batch and keeps refreshing the leases of
// the messages that wait for their turn; a message's own refresher takes over
// when its handler starts.
type queuedLeases struct {
	mu      sync.Mutex
	pre     []preclaim
	started int // messages before this index are handed out
	// refreshing is 1 + the index of the message whose lease is being
	// refreshed right now, 0 if none; refreshed is signalled when that
	// refresh has returned and its result is in pre.
	refreshing int
	refreshed  *sync.Cond
	done       chan struct{}
	wg         sync.WaitGroup
}

// take hands out the claim of message i (nil without a batch claim). If a
// refresh of its lease is in flight, take waits for its result: a refresh
// that finds the lease lost must keep the message from running.
func (q *queuedLeases) take(i int) *preclaim {
	if q == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.started = i + 1 // no refresh of message i starts after this
	for q.refreshing == i+1 {
		q.refreshed.Wait()
	}
	pc := q.pre[i]
	return &pc
}

func (q *queuedLeases) stop() {
	if q == nil || q.done == nil {
		return
	}
	close(q.done)
	q.wg.Wait()
}

// claimQueued claims every key of a batch for lease in one round trip
// through drv when it can (caps), and keeps refreshing them every
// interval; it returns nil otherwise (or when refreshing is disabled, a
// negative every, since the leases of later messages must be kept alive
// while earlier ones run).
func claimQueued(ctx context.Context, env *pathEnv, drv dedupdriver.Lease, caps dedupdriver.Caps, lease, every time.Duration, batch []*job) *queuedLeases {
	if !caps.BatchClaim || len(batch) < 2 || every < 0 {
		return nil
	}
	q := &queuedLeases{pre: make([]preclaim, len(batch))}
	q.refreshed = sync.NewCond(&q.mu)
	tokens := make([]string, len(batch))
	for i := range batch {
		tokens[i] = newToken()
		q.pre[i].token = tokens[i]
	}
	sent := time.Now()
	cs, err := drv.ClaimBatch(ctx, env.scope, dedupRecords(batch), tokens, lease)
	if err != nil || len(cs) != len(batch) {
		env.storeOut.line(ctx, env.log, slog.LevelWarn, "batch claim failed; claiming one by one",
			slog.Int(LogKeyCount, len(batch)), slog.Any(LogKeyError, err))
		return q
	}
	for i := range q.pre {
		q.pre[i].claim, q.pre[i].ok, q.pre[i].confirmed = cs[i], true, sent
	}
	q.done = make(chan struct{})
	q.wg.Go(func() { q.refresh(ctx, env, drv, lease, every, batch) })
	return q
}

// refresh extends the leases of the messages not handed out yet, every
// interval, until q is stopped.
func (q *queuedLeases) refresh(ctx context.Context, env *pathEnv, drv dedupdriver.Lease, lease, every time.Duration, batch []*job) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-q.done:
			return
		case <-t.C:
		}
		q.mu.Lock()
		first := q.started
		q.mu.Unlock()
		for i := first; i < len(batch); i++ {
			q.mu.Lock()
			pc := q.pre[i]
			skip := i < q.started || pc.claim.State != dedup.StateNew || pc.lost != nil
			if !skip {
				q.refreshing = i + 1 // take(i) waits for the result
			}
			q.mu.Unlock()
			if skip {
				continue
			}
			sent := time.Now()
			err := drv.Refresh(ctx, env.scope, batch[i].key, pc.token, lease)
			q.mu.Lock()
			switch {
			case err == nil:
				q.pre[i].confirmed = sent
			case errors.Is(err, dedup.ErrLeaseLost):
				q.pre[i].lost = err
			}
			q.refreshing = 0
			q.refreshed.Broadcast()
			q.mu.Unlock()
			switch {
			case err == nil || errors.Is(err, dedup.ErrLeaseLost):
				env.storeOut.ok(ctx, env.log)
			default:
				env.storeOut.failed(ctx, env.log, fmt.Errorf("idemq: refresh lease: %w", err))
				env.obs.onRefreshFailed(ctx, err)
			}
			// Other errors: retried on the next tick. If they last, the
			// message's confirmation passes leasePath.safeUntil and claim takes the
			// key again before its handler may run.
		}
	}
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
