package pgdedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// queries holds the store's SQL, rendered once for the configured table.
// The clock (Config.Now) is an argument: $5 of the inserts and the renewal,
// $3 of the lookup, $2 of the cleanup.
type queries struct {
	table, claimInsert, claimInsertOne, claimSelect, claimRenew, unclaim, forgetEnded, inspect, cleanup string
	storeResult, storeResults                                                                           string
	// lockOne and lockMany take the keys' advisory locks before the insert
	// on a partitioned table (see newQueries); empty on an unpartitioned one.
	lockOne, lockMany string
}

// On a partitioned table the store's statements are planned for their
// arguments each time they run (custom plans), never from a plan cached
// for the prepared statement. PostgreSQL caches a generic plan after five
// executions, and one made while a day's partition was empty reads that
// partition whole, for every key, once the day's records fill it, until an
// ANALYZE of the partition replaces the plan (docs/operations.md has the
// figures). Statements sent on
// their own are led by pgx.QueryExecModeExec (see planned); those pipelined
// in a batch are put between customPlans and restorePlans, which change
// plan_cache_mode for the transaction alone and put back the value it had.
const (
	customPlans  = `SELECT set_config('idemq.plan_cache_mode', current_setting('plan_cache_mode'), true), set_config('plan_cache_mode', 'force_custom_plan', true)`
	restorePlans = `SELECT set_config('plan_cache_mode', current_setting('idemq.plan_cache_mode'), true)`
)

// planned returns the arguments of a statement the store sends on its own:
// on a partitioned table led by pgx.QueryExecModeExec, which has the server
// plan it for them.
func (s *Store) planned(args ...any) []any {
	if !s.cfg.Partitioned {
		return args
	}
	return append([]any{pgx.QueryExecModeExec}, args...)
}

func newQueries(schema, table string, partitioned bool) queries {
	t := pgx.Identifier{schema, table}.Sanitize()
	// The claim's inserts, of many keys through unnest (in key order, so
	// that concurrent claims lock in that order) and of one key (a batch
	// of 1: no unnest and no sort for the server to run).
	insert := `INSERT INTO ` + t + ` (scope, key, payload_hash, processed_at, expires_at)
SELECT $1, `
	times := `$5::timestamptz, $5 + $4 * interval '1 microsecond'`
	many, one := insert+`u.k, u.h, `+times+`
FROM unnest($2::text[], $3::bytea[]) AS u(k, h)`, insert+`$2, $3, `+times
	q := queries{
		table: t,
		// ON CONFLICT DO NOTHING waits for an uncommitted conflicting row
		// and then skips it if it committed.
		claimInsert: many + `
ORDER BY u.k
ON CONFLICT (scope, key) DO NOTHING
RETURNING key`,
		claimInsertOne: one + `
ON CONFLICT (scope, key) DO NOTHING
RETURNING key`,
		// A new statement, so a new snapshot: it sees the commits the
		// insert waited for.
		claimSelect: `SELECT key, payload_hash, processed_at, expires_at <= $3, result
FROM ` + t + `
WHERE scope = $1 AND key = ANY($2::text[])
ORDER BY key
FOR UPDATE`,
		claimRenew: `UPDATE ` + t + `
SET payload_hash = $3, processed_at = $5::timestamptz, expires_at = $5 + $4 * interval '1 microsecond', result = NULL
WHERE scope = $1 AND key = $2`,
		// The results of keys claimed in the same transaction (see
		// StoreResults): one row, or many through unnest.
		storeResult: `UPDATE ` + t + ` SET result = $3 WHERE scope = $1 AND key = $2`,
		storeResults: `UPDATE ` + t + ` AS p SET result = u.r
FROM unnest($2::text[], $3::bytea[]) AS u(k, r)
WHERE p.scope = $1 AND p.key = u.k`,
		unclaim: `DELETE FROM ` + t + ` WHERE scope = $1 AND key = $2`,
		// The records a handler's COMMIT made durable share the xmin of
		// the handler's own record; no other record does.
		forgetEnded: `DELETE FROM ` + t + ` WHERE scope = $1 AND key = ANY($3::text[])
AND xmin = (SELECT xmin FROM ` + t + ` WHERE scope = $1 AND key = $2)`,
		inspect: `SELECT payload_hash, processed_at, expires_at, result FROM ` + t + ` WHERE scope = $1 AND key = $2`,
		cleanup: `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
SELECT ctid FROM ` + t + ` WHERE expires_at <= $2
LIMIT $1 FOR UPDATE SKIP LOCKED))`,
	}
	if partitioned {
		// A partitioned table enforces (scope, key) only within a
		// partition, so the key's uniqueness is the claim's own work: a
		// transaction-scoped advisory lock per key (scope and key hashed,
		// in the two-key space), taken in one order by every claim, makes
		// concurrent claims of one key take turns whatever day their
		// clocks say; the insert, a later statement and so a later
		// snapshot, then sees every committed record of the key, in any
		// partition, and inserts only when there is none. A key that
		// another claim holds waits, as ON CONFLICT does, for that
		// transaction's outcome.
		q.lockOne = `SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))`
		q.lockMany = `SELECT count(pg_advisory_xact_lock(l.s, l.k)) FROM (
SELECT DISTINCT hashtext($1) AS s, hashtext(k) AS k FROM unnest($2::text[]) AS k ORDER BY 1, 2 OFFSET 0) AS l`
		q.claimInsert = many + `
WHERE NOT EXISTS (SELECT FROM ` + t + ` AS p WHERE p.scope = $1 AND p.key = u.k)
ORDER BY u.k
RETURNING key`
		q.claimInsertOne = one + `
WHERE NOT EXISTS (SELECT FROM ` + t + ` WHERE scope = $1 AND key = $2)
RETURNING key`
	}
	return q
}

// claim runs the claim algorithm on recs in tx. inserted, when not nil, is
// what the first insert returned, already sent (with BEGIN or COMMIT AND
// CHAIN).
func (s *Store) claim(ctx context.Context, tx pgx.Tx, scope string, recs []dedup.Record, inserted map[string]bool) ([]dedup.Claim, error) {
	cs, err := sqlstore.Claim(ctx, &pgClaim{s: s, tx: tx, scope: scope, first: inserted}, recs, 0)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: %w", err)
	}
	return cs, nil
}

// pgClaim runs the statements of one claim in tx.
type pgClaim struct {
	s     *Store
	tx    pgx.Tx
	scope string
	first map[string]bool // the result of an insert already sent, for the first Insert
}

func (c *pgClaim) Insert(ctx context.Context, recs []dedup.Record) (map[string]bool, error) {
	if first := c.first; first != nil {
		c.first = nil
		return first, nil
	}
	b := &pgx.Batch{}
	c.s.queueInsert(b, c.scope, recs)
	br := c.tx.SendBatch(ctx, b)
	inserted, err := c.s.readInsert(br, recs)
	return inserted, closeBatch(br, err)
}

// insertArgs returns the claim's insert for recs and its arguments: the
// single-row statement for one record, else the keys and payload digests as
// arrays.
func (s *Store) insertArgs(scope string, recs []dedup.Record) (string, []any) {
	retention, now := s.retention, s.cfg.Now() // retention boxed once, in New
	if len(recs) == 1 {
		return s.q.claimInsertOne, []any{scope, recs[0].Key, recs[0].PayloadHash[:], retention, now}
	}
	keys := make([]string, len(recs))
	hashes := make([][]byte, len(recs))
	for i, r := range recs {
		keys[i], hashes[i] = r.Key, r.PayloadHash[:]
	}
	return s.q.claimInsert, []any{scope, keys, hashes, retention, now}
}

// queueInsert queues the claim's insert of recs in b; on a partitioned
// table after the keys' advisory locks, and with custom plans.
func (s *Store) queueInsert(b *pgx.Batch, scope string, recs []dedup.Record) {
	sql, args := s.insertArgs(scope, recs)
	switch {
	case s.q.lockOne == "":
		b.Queue(sql, args...)
		return
	case len(recs) == 1:
		b.Queue(customPlans)
		b.Queue(s.q.lockOne, scope, recs[0].Key)
	default:
		b.Queue(customPlans)
		b.Queue(s.q.lockMany, scope, args[1])
	}
	b.Queue(sql, args...)
	b.Queue(restorePlans)
}

// readInsert reads the results queueInsert queued: the keys inserted. It
// does not close br.
func (s *Store) readInsert(br pgx.BatchResults, recs []dedup.Record) (map[string]bool, error) {
	if s.q.lockOne == "" {
		rows, err := br.Query()
		if err != nil {
			return nil, err
		}
		return collectKeys(rows, recs)
	}
	for range 2 { // customPlans and the locks
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	inserted, err := collectKeys(rows, recs)
	if err != nil {
		return nil, err
	}
	if _, err := br.Exec(); err != nil { // restorePlans
		return nil, err
	}
	return inserted, nil
}

// collectKeys reads the keys the insert of recs returned, and closes rows.
func collectKeys(rows pgx.Rows, recs []dedup.Record) (map[string]bool, error) {
	defer rows.Close()
	inserted := make(map[string]bool, len(recs))
	if len(recs) == 1 {
		// The insert returned the one key or nothing: no need to read it
		// (every message at batch 1).
		if rows.Next() {
			inserted[recs[0].Key] = true
		}
		return inserted, rows.Err()
	}
	var k string
	for rows.Next() {
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		inserted[k] = true
	}
	return inserted, rows.Err()
}

func (c *pgClaim) Lookup(ctx context.Context, recs []dedup.Record) (map[string]sqlstore.Found, error) {
	keys := make([]string, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	rows, err := c.tx.Query(ctx, c.s.q.claimSelect, c.s.planned(c.scope, keys, c.s.cfg.Now())...)
	if err != nil {
		return nil, err
	}
	found := make(map[string]sqlstore.Found, len(recs))
	var (
		k string
		h []byte
		f sqlstore.Found
	)
	_, err = pgx.ForEachRow(rows, []any{&k, &h, &f.At, &f.Expired, &f.Result}, func() error {
		var err error
		f.Hash, err = dedup.HashFromBytes(h)
		found[k] = f
		f.Result = nil // the next row scans into a new slice
		return err
	})
	return found, err
}

func (c *pgClaim) Renew(ctx context.Context, r dedup.Record) error {
	_, err := c.tx.Exec(ctx, c.s.q.claimRenew, c.s.planned(c.scope, r.Key, r.PayloadHash[:], c.s.retention, c.s.cfg.Now())...)
	return err
}

// sender returns the store's DB when it can begin a transaction inside a
// pipelined batch (pgx.Batch.BeginTx): a *pgxpool.Pool or a *pgx.Conn; nil
// for any other DB.
func (s *Store) sender() interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
} {
	switch d := s.db.(type) {
	case *pgxpool.Pool:
		return d
	case *pgx.Conn:
		return d
	}
	return nil
}

// BeginClaim implements dedupdriver.Tx: BEGIN and the claim's insert go
// to the server in one pipelined round trip, when the store's DB is a
// *pgxpool.Pool or a *pgx.Conn (with another DB it is Begin then Claim).
// Keys already recorded need one more statement, as in Claim. On an error
// the transaction is rolled back and its connection released.
func (s txDriver) BeginClaim(ctx context.Context, scope string, recs []dedup.Record) (pgx.Tx, []dedup.Claim, error) {
	var (
		tx       pgx.Tx
		inserted map[string]bool
		err      error
	)
	if db := s.sender(); db == nil || len(recs) == 0 {
		if tx, err = s.Begin(ctx); err != nil {
			return nil, nil, err
		}
	} else {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		s.queueInsert(b, scope, recs)
		br := db.SendBatch(ctx, b)
		tx = br.Tx()
		if _, err = br.Exec(); err == nil {
			inserted, err = s.readInsert(br, recs)
		}
		err = closeBatch(br, err)
		if tx == nil {
			return nil, nil, errors.Join(err, errors.New("pgdedup: the batch began no transaction"))
		}
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, nil, fmt.Errorf("pgdedup: begin and claim: %w", err)
		}
	}
	cs, err := s.claim(ctx, tx, scope, recs, inserted)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return tx, cs, nil
}

// CommitChain implements dedupdriver.Tx: COMMIT AND CHAIN and the next
// claim's insert go to the server in one pipelined round trip on tx's
// connection, which stays out of the pool, after the results StoreResults
// queued for tx (see StoreResults). Keys already recorded need one
// more statement, as in Claim. A failed COMMIT AND CHAIN begins nothing and
// the server skips the insert; a transaction that had failed is rolled back
// and refused (ErrTxRefused), as by Commit.
func (s txDriver) CommitChain(ctx context.Context, tx pgx.Tx, scope string, recs []dedup.Record) ([]dedup.Claim, bool, error) {
	rs := s.results.take(tx)
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(rs)+6)}
	n := s.queueResults(b, rs)
	b.Queue(`COMMIT AND CHAIN`)
	s.queueInsert(b, scope, recs)
	br := tx.SendBatch(ctx, b)
	if err := readResults(br, n); err != nil {
		// The server skipped the COMMIT: tx is open and has failed.
		return nil, false, refusedCommit(closeBatch(br, err))
	}
	tag, err := br.Exec()
	if err != nil {
		return nil, false, refusedCommit(closeBatch(br, err))
	}
	if tag.String() == "ROLLBACK" {
		// The transaction had failed: the server rolled it back and
		// chained the next one, which the caller rolls back.
		return nil, false, refusedCommit(closeBatch(br, pgx.ErrTxCommitRollback))
	}
	inserted, err := s.readInsert(br, recs)
	if err = closeBatch(br, err); err != nil {
		return nil, true, fmt.Errorf("pgdedup: claim after commit: %w", err)
	}
	cs, err := s.claim(ctx, tx, scope, recs, inserted)
	return cs, true, err
}

// closeBatch closes br and returns err joined with the error of Close,
// unless that error only repeats err: pgx's batch results return their
// first error again from Close, and joining it printed every error twice.
func closeBatch(br pgx.BatchResults, err error) error {
	cerr := br.Close()
	switch {
	case err == nil:
		return cerr
	case cerr == nil || errors.Is(err, cerr) || cerr.Error() == err.Error():
		return err
	}
	return errors.Join(err, cerr)
}
