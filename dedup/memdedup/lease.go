package memdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
)

// lease is the lease-path state of one key: held under token until until, or
// done (until is then the end of its retention).
type lease struct {
	token       string
	hash        dedup.Hash
	done        bool
	until       time.Time
	processedAt time.Time
	result      []byte // see CompleteWithResult
}

// Leases is the lease-path view of a Store (a dedupdriver.LeaseStore) sharing the
// store's clock, retention, event log and Inspect. It is safe for concurrent
// use.
type Leases struct{ s *Store }

// Leases returns the store's lease-path view. (The two drivers both have
// a Claim method, so one type cannot implement both.)
func (s *Store) Leases() *Leases { return &Leases{s: s} }

// live reports whether l still counts at now.
func (l *lease) live(now time.Time) bool { return l != nil && now.Before(l.until) }

// Claim takes the lease on rec.Key under token for d, unless the key is done
// (StateDone or StateMismatch) or another live lease holds it
// (StateInProgress, even for the same token, as SET NX would answer). An
// expired lease is taken over.
func (ls *Leases) Claim(ctx context.Context, scope string, rec dedup.Record, token string, d time.Duration) (dedup.Claim, error) {
	s := ls.s
	if err := ctx.Err(); err != nil {
		return dedup.Claim{}, err
	}
	if d <= 0 {
		return dedup.Claim{}, fmt.Errorf("memdedup: lease duration must be positive, got %s", d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	k := key{scope, rec.Key}
	if l := s.leases[k]; l.live(now) {
		c := dedup.Claim{Key: rec.Key, StoredHash: l.hash, ProcessedAt: l.processedAt}
		switch {
		case !l.done:
			c.State = dedup.StateInProgress
		case l.hash == rec.PayloadHash:
			c.State = dedup.StateDone
			c.Result = l.result
		default:
			c.State = dedup.StateMismatch
		}
		return c, nil
	}
	s.leases[k] = &lease{token: token, hash: rec.PayloadHash, until: now.Add(d)}
	return dedup.Claim{Key: rec.Key, State: dedup.StateNew}, nil
}

// held returns the live, unfinished lease of k held by token, or nil.
// s.mu is held.
func (s *Store) held(k key, token string) *lease {
	l := s.leases[k]
	if !l.live(s.cfg.Now()) || l.done || l.token != token {
		return nil
	}
	return l
}

// Refresh extends the lease held by token to d from now, or returns
// dedup.ErrLeaseLost.
func (ls *Leases) Refresh(ctx context.Context, scope, k, token string, d time.Duration) error {
	s := ls.s
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.held(key{scope, k}, token)
	if l == nil {
		return fmt.Errorf("memdedup: refresh of key %q: %w", k, dedup.ErrLeaseLost)
	}
	l.until = s.cfg.Now().Add(d)
	return nil
}

// Complete marks the key done under token and keeps it for retention (the
// store's Config.Retention when retention is not positive), or returns
// dedup.ErrLeaseLost.
func (ls *Leases) Complete(ctx context.Context, scope, k, token string, retention time.Duration) error {
	return ls.complete(ctx, scope, k, token, retention, nil)
}

// complete is Complete, storing result with the key.
func (ls *Leases) complete(ctx context.Context, scope, k, token string, retention time.Duration, result []byte) error {
	s := ls.s
	if err := ctx.Err(); err != nil {
		return err
	}
	if retention <= 0 {
		retention = s.cfg.Retention
	}
	s.mu.Lock()
	l := s.held(key{scope, k}, token)
	if l == nil {
		s.mu.Unlock()
		return fmt.Errorf("memdedup: complete of key %q: %w", k, dedup.ErrLeaseLost)
	}
	now := s.cfg.Now()
	l.done, l.processedAt, l.until, l.result = true, now, now.Add(retention), result
	ev := s.event(EventComplete, 0, []Key{{Scope: scope, Key: k}}, nil)
	s.mu.Unlock()
	s.emit(ev)
	return nil
}

// Abandon drops the lease held by token; it changes nothing if token does not
// hold it.
func (ls *Leases) Abandon(ctx context.Context, scope, k, token string) error {
	s := ls.s
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	kk := key{scope, k}
	if s.held(kk, token) == nil {
		s.mu.Unlock()
		return nil
	}
	delete(s.leases, kk)
	ev := s.event(EventAbandon, 0, []Key{{Scope: scope, Key: k}}, nil)
	s.mu.Unlock()
	s.emit(ev)
	return nil
}

// Inspect returns what the store holds for key in scope: a live lease (held or
// done), else a committed record of the transactional path, else
// dedup.ErrNotFound.
func (ls *Leases) Inspect(ctx context.Context, scope, k string) (dedup.Entry, error) {
	s := ls.s
	if err := ctx.Err(); err != nil {
		return dedup.Entry{}, err
	}
	s.mu.Lock()
	l := s.leases[key{scope, k}]
	if l.live(s.cfg.Now()) {
		defer s.mu.Unlock()
		e := dedup.Entry{Scope: scope, Key: k, PayloadHash: l.hash, InProgress: !l.done, Result: l.result}
		if l.done {
			e.ProcessedAt, e.ExpiresAt = l.processedAt, l.until
		} else {
			e.LeaseUntil = l.until
		}
		return e, nil
	}
	s.mu.Unlock()
	return s.Record(scope, k)
}
