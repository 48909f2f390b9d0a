package leasepath_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// leaseAudit watches what the Redis store told every worker about every key,
// in the order the calls happened in this process, and checks each handler
// start against it. It needs no clock: a handler may start only under a
// token that the store granted, that no refresh made while it was queued has
// since reported lost, and
// that no later claim by another token has displaced (a claim sent after this
// token's grant returned and granted to another token proves, by Redis's own
// ordering, that this token's lease had ended).
type leaseAudit struct {
	mu         sync.Mutex
	seq        int               // counts store calls sent and returned
	grantedAt  map[string]int    // token → seq when its last grant returned
	lost       map[string]bool   // token → a refresh or complete reported ErrLeaseLost
	lostQueued map[string]bool   // token → a refresh made before its handler ran reported ErrLeaseLost
	tokenKey   map[string]string // token → key
	grants     map[string][]grant
	doneBy     map[string]string // key → token that completed it
	ran        map[string]bool   // token → its handler started
	violations []string
	// expiredStarts counts handler starts after the handler's own
	// refresher reported the token's lease lost (see start).
	expiredStarts int
	batches       int
}

// grant is one StateNew claim of a key: the seq when its call was sent and
// when it returned.
type grant struct {
	token          string
	sent, returned int
}

func newLeaseAudit() *leaseAudit {
	return &leaseAudit{
		grantedAt: map[string]int{}, lost: map[string]bool{}, lostQueued: map[string]bool{}, tokenKey: map[string]string{},
		grants: map[string][]grant{}, doneBy: map[string]string{}, ran: map[string]bool{},
	}
}

func (a *leaseAudit) tick() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	return a.seq
}

func (a *leaseAudit) claimed(key, token string, sent int, c dedup.Claim) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	if c.State != dedup.StateNew {
		return
	}
	a.grantedAt[token] = a.seq
	a.tokenKey[token] = key
	a.grants[key] = append(a.grants[key], grant{token: token, sent: sent, returned: a.seq})
}

func (a *leaseAudit) reported(key, token string, err error, complete, queued bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	switch {
	case errors.Is(err, dedup.ErrLeaseLost):
		a.lost[token] = true
		if queued {
			a.lostQueued[token] = true
		}
	case err == nil && complete:
		a.doneBy[key] = token
	}
}

// start checks that the handler of key may start under token now.
func (a *leaseAudit) start(key, token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	a.ran[token] = true
	bad := func(format string, args ...any) {
		a.violations = append(a.violations, fmt.Sprintf("key %s, token %.8s: handler started although ", key, token)+fmt.Sprintf(format, args...))
	}
	at, ok := a.grantedAt[token]
	switch {
	case !ok || a.tokenKey[token] != key:
		bad("the store never granted this token the key")
	case a.lostQueued[token]:
		bad("a refresh of its queued lease had reported the lease lost")
	case a.doneBy[key] != "":
		bad("token %.8s had already completed the key", a.doneBy[key])
	default:
		if a.lost[token] {
			// The handler's own refresher found the lease lost
			// before the handler got to run (the process stalled
			// past the lease): its ctx is cancelled. Counted.
			a.expiredStarts++
		}
		for _, g := range a.grants[key] {
			if g.token != token && g.sent > at {
				bad("token %.8s claimed the key after this token's grant", g.token)
			}
		}
	}
}

// handler wraps h so that every start is checked.
func (a *leaseAudit) handler(h consumer.Handler) consumer.Handler {
	return func(ctx context.Context, m *consumer.Message) error {
		token, ok := consumer.LeaseToken(ctx)
		if !ok {
			a.mu.Lock()
			a.violations = append(a.violations, fmt.Sprintf("key %s: handler started without a lease token", m.Key))
			a.mu.Unlock()
		}
		a.start(m.Key, token)
		return h(ctx, m)
	}
}

// lostRuns returns, per key, the handler runs whose lease the store later
// reported lost. Call it once the runners stopped.
func (a *leaseAudit) lostRuns() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := map[string]int{}
	for token := range a.ran {
		if a.lost[token] {
			n[a.tokenKey[token]]++
		}
	}
	return n
}

// auditedStore is a Redis lease store that reports to a leaseAudit.
type auditedStore struct {
	dedupdriver.Lease
	audit *leaseAudit
}

func (s *auditedStore) Driver() dedupdriver.Lease { return s }

func (s *auditedStore) Claim(ctx context.Context, scope string, rec dedup.Record, token string, lease time.Duration) (dedup.Claim, error) {
	sent := s.audit.tick()
	c, err := s.Lease.Claim(ctx, scope, rec, token, lease)
	if err == nil {
		s.audit.claimed(rec.Key, token, sent, c)
	}
	return c, err
}

func (s *auditedStore) ClaimBatch(ctx context.Context, scope string, recs []dedup.Record, tokens []string, lease time.Duration) ([]dedup.Claim, error) {
	sent := s.audit.tick()
	cs, err := s.Lease.ClaimBatch(ctx, scope, recs, tokens, lease)
	s.audit.mu.Lock()
	s.audit.batches++
	s.audit.mu.Unlock()
	if err == nil && len(cs) == len(recs) {
		for i, r := range recs {
			s.audit.claimed(r.Key, tokens[i], sent, cs[i])
		}
	}
	return cs, err
}

func (s *auditedStore) Refresh(ctx context.Context, scope, key, token string, lease time.Duration) error {
	err := s.Lease.Refresh(ctx, scope, key, token, lease)
	// The refresher of a running handler passes the handler's ctx, which
	// carries the token; the refresher of queued leases does not.
	_, running := consumer.LeaseToken(ctx)
	s.audit.reported(key, token, err, false, !running)
	return err
}

func (s *auditedStore) Complete(ctx context.Context, scope, key, token string, retention time.Duration) error {
	err := s.Lease.Complete(ctx, scope, key, token, retention)
	s.audit.reported(key, token, err, true, false)
	return err
}
