package pgdedup

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// PoolSize returns the MaxConns of the *pgxpool.Pool behind the store (4 or
// the number of CPUs, whichever is larger, unless the pool's configuration or
// its pool_max_conns connection-string parameter says otherwise), or 0 for
// any other DB. consumer.NewRunner uses it to refuse a Concurrency the pool
// cannot serve (see dedupdriver.Caps.Pool).
func (s txDriver) PoolSize() int {
	if p, ok := s.db.(*pgxpool.Pool); ok {
		return int(p.Config().MaxConns)
	}
	return 0
}
