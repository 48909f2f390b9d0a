package consumer

import (
	"context"
	"database/sql"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
)

// forwardTx is the simplest store wrapper: it forwards the driver it wraps,
// and nothing else.
type forwardTx[T any] struct{ dedupdriver.Tx[T] }

func (w forwardTx[T]) Driver() dedupdriver.Tx[T] { return w }

// forwardLease is forwardTx for the lease path.
type forwardLease struct{ dedupdriver.Lease }

func (w forwardLease) Driver() dedupdriver.Lease { return w }

// pathSees names what the Runner does with path's store, in the words of
// the optional interfaces it once asserted on the store: the capability
// table the stores had then is the one they must keep.
func pathSees(p Path) []string {
	c := p.driverCaps()
	_, lease := p.(*leasePath)
	tx := !lease
	var out []string
	add := func(ok bool, name string) {
		if ok {
			out = append(out, name)
		}
	}
	add(c.BeginClaim, "BeginClaimer")
	add(c.CommitChain, "CommitChainer")
	add(c.Aborted, "AbortClassifier")
	add(c.FailedTx, "FailedTxReporter")
	add(c.EndedTx, "EndedTxReporter")
	add(c.Transient, "TransientClassifier")
	add(c.Pool, "PoolSizer")
	if r, ok := p.retention(); tx && ok && r > 0 {
		out = append(out, "RetentionReporter")
	}
	add(c.SchemaCheck, "SchemaChecker")
	add(c.BatchClaim, "BatchClaimer")
	add(c.FailureCount, "FailureCounter")
	add(c.Results && tx, "ResultStorer")
	add(c.Results && !tx, "ResultCompleter")
	add(c.Durability, "DurabilityReporter")
	return out
}

// The Runner takes the same paths for each store as when it asserted
// optional interfaces on it (dedup's capability table of then), and a
// wrapper that forwards the store's driver keeps every one of them.
func TestRunnerSeesEachStoresCapabilities(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none?pool_max_conns=8")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pg, err := pgdedup.New(pool, pgdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sq, err := sqldedup.New(&sql.DB{}, sqldedup.Config{Dialect: sqldedup.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memdedup.New(memdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	noTx := func(context.Context, pgx.Tx, *Message) error { return nil }
	noSQL := func(context.Context, *sql.Tx, *Message) error { return nil }
	noMem := func(context.Context, *memdedup.Tx, *Message) error { return nil }
	noLease := func(context.Context, *Message) error { return nil }
	for _, tc := range []struct {
		store    string
		path     Path
		wrapped  Path
		wantSeen []string
	}{
		{"pgdedup", Transactional(pg, noTx), Transactional(forwardTx[pgx.Tx]{pg.Driver()}, noTx), []string{
			"BeginClaimer", "CommitChainer", "AbortClassifier", "FailedTxReporter", "EndedTxReporter", "TransientClassifier",
			"PoolSizer", "RetentionReporter", "SchemaChecker", "FailureCounter", "ResultStorer"}},
		{"sqldedup", Transactional(sq, noSQL), Transactional(forwardTx[*sql.Tx]{sq.Driver()}, noSQL), []string{
			"AbortClassifier", "TransientClassifier", "PoolSizer", "RetentionReporter", "SchemaChecker", "FailureCounter", "ResultStorer"}},
		{"memdedup.Store", Transactional(mem, noMem), Transactional(forwardTx[*memdedup.Tx]{mem.Driver()}, noMem), []string{
			"RetentionReporter", "FailureCounter", "ResultStorer"}},
		{"memdedup.Leases", Leased(mem.Leases(), noLease, LeaseOptions{}), Leased(forwardLease{mem.Leases().Driver()}, noLease, LeaseOptions{}), []string{
			"FailureCounter", "ResultCompleter"}},
	} {
		if got := pathSees(tc.path); !slices.Equal(got, tc.wantSeen) {
			t.Errorf("%s: the runner sees %q, want %q", tc.store, got, tc.wantSeen)
		}
		if got := pathSees(tc.wrapped); !slices.Equal(got, tc.wantSeen) {
			t.Errorf("%s behind a forwarding wrapper: the runner sees %q, want %q", tc.store, got, tc.wantSeen)
		}
		if tc.store == "pgdedup" && tc.path.poolSize() != 8 {
			t.Errorf("pgdedup: the runner sees a pool of %d, want the pool's 8", tc.path.poolSize())
		}
		if err := tc.path.validate(); err != nil {
			t.Errorf("%s: %v", tc.store, err)
		}
	}
}
