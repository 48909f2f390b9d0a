package sqldedup

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemq/idemq/dedup"
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
var _ dedupdriver.Tx[*sql.Tx] = txDriver{}

// Driver returns the store's driver, which consumer.Transactional takes the
// store for. Only a wrapper of the store (to count, trace or inject faults)
// needs to call it.
func (s *Store) Driver() dedupdriver.Tx[*sql.Tx] { return txDriver{s, s.shared.Common()} }

// Caps implements dedupdriver.Tx: sqldedup classifies the errors of the
// Postgres dialect's drivers and of SQLite, and sends each statement on its
// own (no pipelined begin or chained commit, which database/sql lacks).
func (s txDriver) Caps() dedupdriver.Caps {
	return dedupdriver.Caps{
		Aborted: true, Transient: true, Pool: true, Retention: s.cfg.Retention,
		SchemaCheck: true, FailureCount: true, Results: true,
	}
}

// BeginClaim implements dedupdriver.Tx: database/sql cannot pipeline, so it
// returns dedupdriver.ErrUnsupported (Caps.BeginClaim is false).
func (txDriver) BeginClaim(context.Context, string, []dedup.Record) (*sql.Tx, []dedup.Claim, error) {
	return nil, nil, dedupdriver.ErrUnsupported
}

// CommitChain implements dedupdriver.Tx: dedupdriver.ErrUnsupported
// (Caps.CommitChain is false); nothing is sent.
func (txDriver) CommitChain(context.Context, *sql.Tx, string, []dedup.Record) ([]dedup.Claim, bool, error) {
	return nil, false, dedupdriver.ErrUnsupported
}

// Failed implements dedupdriver.Tx: database/sql does not tell
// (Caps.FailedTx is false).
func (txDriver) Failed(*sql.Tx) bool { return false }

// Ended implements dedupdriver.Tx: database/sql does not tell
// (Caps.EndedTx is false).
func (txDriver) Ended(*sql.Tx) bool { return false }

// ForgetEnded implements dedupdriver.Tx: dedupdriver.ErrUnsupported
// (Caps.EndedTx is false).
func (txDriver) ForgetEnded(context.Context, *sql.Tx, string, string, []string) error {
	return dedupdriver.ErrUnsupported
}

// PoolSize returns the MaxOpenConnections of the *sql.DB behind a Postgres
// store (0, the database/sql default, means no limit), or 0 for any other
// DB. consumer.NewRunner uses it to refuse a Concurrency the pool cannot
// serve (see dedupdriver.Caps.Pool).
//
// A SQLite store reports 0: OpenSQLite's one connection is on purpose (see
// OpenSQLite), and the runner's batches queue for it.
func (s txDriver) PoolSize() int {
	if s.cfg.Dialect != Postgres {
		return 0
	}
	if db, ok := s.db.(interface{ Stats() sql.DBStats }); ok {
		return db.Stats().MaxOpenConnections
	}
	return 0
}

// StoreResults implements dedupdriver.Tx: it writes each result into the
// record of its key, claimed in tx, one statement per result (database/sql
// has no portable array parameter). The result column (migration 003) is
// NULL for records without one. The store has no size limit of its own
// below the database's (1 GB for PostgreSQL's bytea and SQLite's default
// SQLITE_MAX_LENGTH): the runner's consumer.Config.MaxResultBytes is the
// limit.
func (s txDriver) StoreResults(ctx context.Context, tx *sql.Tx, scope string, results []dedup.Result) error {
	for _, r := range results {
		if _, err := tx.ExecContext(ctx, s.q.storeResult(), scope, r.Key, r.Value); err != nil {
			return fmt.Errorf("sqldedup: store result of %q: %w", r.Key, err)
		}
	}
	return nil
}
