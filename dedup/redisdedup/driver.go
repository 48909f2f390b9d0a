package redisdedup

import (
	"context"

	"github.com/idemq/idemq/dedup/dedupdriver"
)

// leaseDriver is the store's side of the lease path's protocol
// (dedupdriver.Lease), which the consumer.Runner drives: the store's own
// lease operations, and the failure counts.
type leaseDriver struct{ *Store }

// The driver implements the whole protocol, checked at compile time.
var _ dedupdriver.Lease = leaseDriver{}

// Driver returns the store's driver, which consumer.Leased takes the store
// for. Only a wrapper of the store (to count, trace or inject faults) needs
// to call it.
func (s *Store) Driver() dedupdriver.Lease { return leaseDriver{s} }

// Caps implements dedupdriver.Lease: redisdedup claims batches in one
// pipeline, keeps results, counts failures and reads Redis's persistence
// settings (Store.Durability).
func (leaseDriver) Caps() dedupdriver.Caps {
	return dedupdriver.Caps{BatchClaim: true, Results: true, FailureCount: true, Durability: true}
}

// CheckSchema implements dedupdriver.Lease: Redis has no schema, so it
// returns dedupdriver.ErrUnsupported (Caps.SchemaCheck is false).
func (leaseDriver) CheckSchema(context.Context) error { return dedupdriver.ErrUnsupported }
