package pgdedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
)

// StoreResults implements dedupdriver.Tx: each result goes into the
// record of its key, claimed in tx, in one statement. The result column
// (migration 003, bytea) is NULL for records without one. The store has no
// size limit of its own below PostgreSQL's 1 GB: the runner's
// consumer.Config.MaxResultBytes is the limit.
//
// When the store's DB is a *pgxpool.Pool or a *pgx.Conn (the ones BeginClaim
// pipelines on), the statement is queued and sent when the store ends tx,
// so the results commit or roll back with the records and the handlers'
// writes: by CommitChain in the same pipelined round trip as COMMIT AND
// CHAIN (no round trip of its own), by Commit just before the COMMIT (one).
// End such a tx through the store, as the runner does: results queued for a
// tx committed with tx.Commit are not written. The store's Rollback drops
// them. With another DB the statement is sent at once (one round trip). results must not be modified
// until tx ends. It is safe for concurrent use on different transactions.
func (s txDriver) StoreResults(ctx context.Context, tx pgx.Tx, scope string, results []dedup.Result) error {
	if len(results) == 0 {
		return nil
	}
	if s.sender() != nil {
		s.results.queue(tx, scope, results)
		return nil
	}
	sql, args := s.resultArgs(scope, results)
	if _, err := tx.Exec(ctx, sql, s.planned(args...)...); err != nil {
		return fmt.Errorf("pgdedup: store results: %w", err)
	}
	return nil
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
	// txs counts the transactions in m, so that the commits and rollbacks
	// of transactions without results (most of them) take no lock.
	txs atomic.Int64
	mu  sync.Mutex
	m   map[pgx.Tx][]scopedResults
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
	if _, ok := q.m[tx]; !ok {
		q.txs.Add(1)
	}
	q.m[tx] = append(q.m[tx], scopedResults{scope: scope, results: results})
}

// take removes and returns the results queued for tx. A transaction's
// queue and take run in its own goroutine, one after the other, so when
// no transaction has results the count alone answers.
func (q *queuedResults) take(tx pgx.Tx) []scopedResults {
	if q.txs.Load() == 0 {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	rs, ok := q.m[tx]
	if ok {
		delete(q.m, tx)
		q.txs.Add(-1)
	}
	return rs
}

// queueResults queues in b the statements that write rs, before the
// COMMIT that b ends with (on a partitioned table after customPlans, which
// the COMMIT ends), and returns how many it queued.
func (s *Store) queueResults(b *pgx.Batch, rs []scopedResults) int {
	if len(rs) == 0 {
		return 0
	}
	n := len(rs)
	if s.cfg.Partitioned {
		b.Queue(customPlans)
		n++
	}
	for _, r := range rs {
		sql, args := s.resultArgs(r.scope, r.results)
		b.Queue(sql, args...)
	}
	return n
}

// readResults reads the results of the n statements queueResults queued at
// the head of br. On an error the server skipped the rest of the batch (the
// COMMIT with it), so the transaction is still open and has failed.
func readResults(br pgx.BatchResults, n int) error {
	for range n {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("pgdedup: store results: %w", err)
		}
	}
	return nil
}

// commitWithResults writes rs and commits tx: the one case where the
// results cost a round trip of their own. (Pipelining them with a plain
// COMMIT would leave pgx's Tx open on the client, and closing it without a
// round trip takes a call that a pgx tracer reports as failed.) tx is
// closed when it returns: committed, or rolled back after a failure.
func (s *Store) commitWithResults(ctx context.Context, tx pgx.Tx, rs []scopedResults) error {
	for _, r := range rs {
		sql, args := s.resultArgs(r.scope, r.results)
		if _, err := tx.Exec(ctx, sql, s.planned(args...)...); err != nil {
			err = fmt.Errorf("pgdedup: store results: %w", err)
			if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
				err = errors.Join(err, rerr)
			}
			return refusedCommit(err)
		}
	}
	return refusedCommit(tx.Commit(ctx))
}
