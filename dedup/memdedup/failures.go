package memdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
)

// failureCount is the handler-failure count of one key.
type failureCount struct {
	n         int
	hash      dedup.Hash
	expiresAt time.Time
}

// RecordFailure implements dedupdriver.Common. The count lives outside
// every transaction (a rollback does not undo it) and expires Retention after
// its last failure; a failure with another payload digest starts it again at
// 1. Store and its Leases share the counts.
func (s txDriver) RecordFailure(ctx context.Context, scope string, rec dedup.Record) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.takeFault(RecordFailureError); f != nil {
		return 0, fmt.Errorf("memdedup: record failure: %w", f.err())
	}
	if s.fails == nil {
		s.fails = make(map[key]failureCount)
	}
	now := s.cfg.Now()
	fk := key{scope, rec.Key}
	c := s.fails[fk]
	if !now.Before(c.expiresAt) || c.hash != rec.PayloadHash {
		c = failureCount{hash: rec.PayloadHash}
	}
	c.n++
	c.expiresAt = now.Add(s.cfg.Retention)
	s.fails[fk] = c
	return c.n, nil
}

// ForgetFailures implements dedupdriver.Common.
func (s txDriver) ForgetFailures(ctx context.Context, scope, k string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.fails, key{scope, k})
	return nil
}

// Failures returns the live handler-failure count of key in scope (0 if
// none), for tests.
func (s *Store) Failures(scope, k string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.fails[key{scope, k}]
	if !s.cfg.Now().Before(c.expiresAt) {
		return 0
	}
	return c.n
}

// RecordFailure implements dedupdriver.Common with the counts of the
// store the Leases belong to.
func (ls leaseDriver) RecordFailure(ctx context.Context, scope string, rec dedup.Record) (int, error) {
	return txDriver{ls.s}.RecordFailure(ctx, scope, rec)
}

// ForgetFailures implements dedupdriver.Common with the counts of the
// store the Leases belong to.
func (ls leaseDriver) ForgetFailures(ctx context.Context, scope, key string) error {
	return txDriver{ls.s}.ForgetFailures(ctx, scope, key)
}
