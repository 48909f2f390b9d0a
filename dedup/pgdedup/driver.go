package pgdedup

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// txDriver is the store's side of the transactional path's protocol
// (dedupdriver.Tx), which the consumer.Runner drives.
type txDriver struct {
	*Store
	sqlstore.Common // what the drivers of the SQL stores share
}

// The driver implements the whole protocol, checked at compile time.
var _ dedupdriver.Tx[pgx.Tx] = txDriver{}

// Driver returns the store's driver, which consumer.Transactional takes the
// store for. Only a wrapper of the store (to count, trace or inject faults)
// needs to call it.
func (s *Store) Driver() dedupdriver.Tx[pgx.Tx] { return txDriver{s, s.shared.Common()} }

// Caps implements dedupdriver.Tx: pgdedup pipelines its begin and claim,
// chains commits, and classifies PostgreSQL's errors.
func (s txDriver) Caps() dedupdriver.Caps {
	return dedupdriver.Caps{
		BeginClaim: true, CommitChain: true, Aborted: true, FailedTx: true, EndedTx: true,
		Transient: true, Pool: true, Retention: s.cfg.Retention, SchemaCheck: true,
		FailureCount: true, Results: true,
	}
}

// CheckSchema implements dedupdriver.Tx: Store.CheckSchema.
func (s txDriver) CheckSchema(ctx context.Context) error { return s.Store.CheckSchema(ctx) }
