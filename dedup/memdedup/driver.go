package memdedup

import (
	"context"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// txDriver is the Store's side of the transactional path's protocol
// (dedupdriver.Tx): its own transactions, claims, results and failure
// counts.
type txDriver struct{ *Store }

// leaseDriver is the Leases' side of the lease path's protocol
// (dedupdriver.Lease).
type leaseDriver struct{ *Leases }

// The drivers implement the whole protocol, checked at compile time.
var (
	_ dedupdriver.Tx[*Tx]      = txDriver{}
	_ dedupdriver.Lease        = leaseDriver{}
	_ dedupdriver.TxStore[*Tx] = (*Store)(nil)
	_ dedupdriver.LeaseStore   = (*Leases)(nil)
)

// Driver returns the store's driver of the transactional path, which
// consumer.Transactional takes the store for.
func (s *Store) Driver() dedupdriver.Tx[*Tx] { return txDriver{s} }

// Caps implements dedupdriver.Tx: the store keeps results, counts failures
// and forgets records after Config.Retention.
func (s txDriver) Caps() dedupdriver.Caps {
	return dedupdriver.Caps{Retention: s.cfg.Retention, FailureCount: true, Results: true}
}

// CheckSchema implements dedupdriver.Tx: there is no schema
// (dedupdriver.ErrUnsupported).
func (txDriver) CheckSchema(context.Context) error { return dedupdriver.ErrUnsupported }

// BeginClaim implements dedupdriver.Tx: dedupdriver.ErrUnsupported.
func (txDriver) BeginClaim(context.Context, string, []dedup.Record) (*Tx, []dedup.Claim, error) {
	return nil, nil, dedupdriver.ErrUnsupported
}

// CommitChain implements dedupdriver.Tx: dedupdriver.ErrUnsupported.
func (txDriver) CommitChain(context.Context, *Tx, string, []dedup.Record) ([]dedup.Claim, bool, error) {
	return nil, false, dedupdriver.ErrUnsupported
}

// IsAborted implements dedupdriver.Tx: false.
func (txDriver) IsAborted(error) bool { return false }

// IsTransient implements dedupdriver.Tx: false.
func (txDriver) IsTransient(error) bool { return false }

// Failed implements dedupdriver.Tx: false.
func (txDriver) Failed(*Tx) bool { return false }

// Ended implements dedupdriver.Tx: false.
func (txDriver) Ended(*Tx) bool { return false }

// ForgetEnded implements dedupdriver.Tx: dedupdriver.ErrUnsupported.
func (txDriver) ForgetEnded(context.Context, *Tx, string, string, []string) error {
	return dedupdriver.ErrUnsupported
}

// PoolSize implements dedupdriver.Tx: 0, there is no pool.
func (txDriver) PoolSize() int { return 0 }

// Driver returns the driver of the lease path, which consumer.Leased takes
// the Leases for.
func (ls *Leases) Driver() dedupdriver.Lease { return leaseDriver{ls} }

// Caps implements dedupdriver.Lease: the Leases keep results and count
// failures.
func (leaseDriver) Caps() dedupdriver.Caps {
	return dedupdriver.Caps{FailureCount: true, Results: true}
}

// CheckSchema implements dedupdriver.Lease: dedupdriver.ErrUnsupported.
func (leaseDriver) CheckSchema(context.Context) error { return dedupdriver.ErrUnsupported }

// ClaimBatch implements dedupdriver.Lease: dedupdriver.ErrUnsupported.
func (leaseDriver) ClaimBatch(context.Context, string, []dedup.Record, []string, time.Duration) ([]dedup.Claim, error) {
	return nil, dedupdriver.ErrUnsupported
}

// Durability implements dedupdriver.Tx: dedupdriver.ErrUnsupported
// (Caps.Durability is false).
func (txDriver) Durability(context.Context) (dedup.Durability, error) {
	return dedup.Durability{}, dedupdriver.ErrUnsupported
}

// Durability implements dedupdriver.Lease: dedupdriver.ErrUnsupported
// (Caps.Durability is false).
func (leaseDriver) Durability(context.Context) (dedup.Durability, error) {
	return dedup.Durability{}, dedupdriver.ErrUnsupported
}
