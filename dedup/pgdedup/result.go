package pgdedup

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup"
)

// StoreResults implements dedup.ResultStorer: each result goes into the
// record of its key, claimed in tx, in one statement. The result column
// (migration 003, bytea) is NULL for records without one. The store has no
// size limit of its own below PostgreSQL's 1 GB: the runner's
// consumer.Config.MaxResultBytes is the limit.
//
// When the store's DB is a *pgxpool.Pool or a *pgx.Conn (the ones BeginClaim
// pipelines on), the statement costs no round trip of its own: it is queued
// and sent with the COMMIT of tx by the store's Commit or CommitChain, in
// the same pipelined round trip, so the results commit or roll back with
// the records and the handlers' writes. Commit such a tx through the store,
// as the runner does: results queued for a tx committed with tx.Commit are
// not written. The store's Rollback drops them. With another DB the
// statement is sent at once (one round trip). results must not be modified
// until tx ends. It is safe for concurrent use on different transactions.
func (s *Store) StoreResults(ctx context.Context, tx pgx.Tx, scope string, results []dedup.Result) error {
	if len(results) == 0 {
		return nil
	}
	if s.pipelined() {
		s.results.queue(tx, scope, results)
		return nil
	}
	sql, args := s.resultArgs(scope, results)
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("pgdedup: store results: %w", err)
	}
	return nil
}

// pipelined reports whether the store's DB pipelines statements in batches
// (a *pgxpool.Pool or a *pgx.Conn): then results wait for the commit.
func (s *Store) pipelined() bool {
	switch s.db.(type) {
	case *pgxpool.Pool, *pgx.Conn:
		return true
	}
	return false
}

// resultArgs returns the statement that writes results and its arguments:
// one row, or many through unnest.
func (s *Store) resultArgs(scope string, results []dedup.Result) (string, []any) {
	if len(results) == 1 {
		return s.q.storeResult, []any{scope, results[0].Key, results[0].Value}
	}
	keys := make([]string, len(results))
	values := make([][]byte, len(results))
	for i, r := range results {
		keys[i], values[i] = r.Key, r.Value
	}
	return s.q.storeResults, []any{scope, keys, values}
}

// queuedResults are the results of each open transaction that wait for its
// commit (see StoreResults). It is safe for concurrent use.
type queuedResults struct {
	mu sync.Mutex
	m  map[pgx.Tx][]scopedResults
}

// scopedResults are the results of one StoreResults call.
type scopedResults struct {
	scope   string
	results []dedup.Result
}

func (q *queuedResults) queue(tx pgx.Tx, scope string, results []dedup.Result) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = map[pgx.Tx][]scopedResults{}
	}
	q.m[tx] = append(q.m[tx], scopedResults{scope: scope, results: results})
}

// take removes and returns the results queued for tx.
func (q *queuedResults) take(tx pgx.Tx) []scopedResults {
	q.mu.Lock()
	defer q.mu.Unlock()
	rs, ok := q.m[tx]
	if ok {
		delete(q.m, tx)
	}
	return rs
}

// queueResults queues in b the statements that write rs, before the
// COMMIT that b ends with.
func (s *Store) queueResults(b *pgx.Batch, rs []scopedResults) {
	for _, r := range rs {
		sql, args := s.resultArgs(r.scope, r.results)
		b.Queue(sql, args...)
	}
}

// readResults reads the results of the n result statements at the head of
// br. On an error the server skipped the rest of the batch (the COMMIT
// with it), so the transaction is still open and has failed.
func readResults(br pgx.BatchResults, n int) error {
	for range n {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("pgdedup: store results: %w", err)
		}
	}
	return nil
}

// commitWithResults sends the statements of rs and COMMIT in one pipelined
// round trip. tx is closed (its connection back in its pool) when it
// returns: committed, or rolled back after a failure.
func (s *Store) commitWithResults(ctx context.Context, tx pgx.Tx, rs []scopedResults) error {
	b := &pgx.Batch{}
	s.queueResults(b, rs)
	b.Queue(`COMMIT`)
	br := tx.SendBatch(ctx, b)
	err := readResults(br, len(rs))
	if err == nil {
		var tag string
		t, cerr := br.Exec()
		tag, err = t.String(), cerr
		if err == nil && tag == "ROLLBACK" {
			err = pgx.ErrTxCommitRollback
		}
	}
	err = closeBatch(br, err)
	c := tx.Conn()
	if err == nil && c != nil && c.PgConn().TxStatus() == 'I' {
		closeCommitted(tx)
		return nil
	}
	// The COMMIT did not happen (or its outcome is unknown): end tx as
	// its own Commit does after a failure.
	if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) && err == nil {
		err = rerr
	}
	return refusedCommit(err)
}

// closeCommitted marks tx, whose COMMIT the server already confirmed
// through a batch, as ended, without sending anything: its Commit with a
// context that is already done fails before it writes to the connection
// (pgconn checks the context first), and still closes tx and, for a pool's
// transaction, gives its connection, idle and outside any transaction,
// back to the pool. A pgx tracer sees that Commit end with
// context.Canceled.
func closeCommitted(tx pgx.Tx) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_ = tx.Commit(done)
}
