package pgdedup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// queries holds the store's SQL, rendered once for the configured table.
type queries struct {
	table, claimInsert, claimSelect, claimRenew, unclaim, inspect, cleanup string
}

func newQueries(schema, table string) queries {
	t := pgx.Identifier{schema, table}.Sanitize()
	return queries{
		table: t,
		// Rows are inserted in key order, so concurrent claims lock in
		// that order. ON CONFLICT DO NOTHING waits for an uncommitted
		// conflicting row and then skips it if it committed.
		claimInsert: `INSERT INTO ` + t + ` (scope, key, payload_hash, expires_at)
SELECT $1, u.k, u.h, now() + $4 * interval '1 microsecond'
FROM unnest($2::text[], $3::bytea[]) AS u(k, h)
ORDER BY u.k
ON CONFLICT (scope, key) DO NOTHING
RETURNING key`,
		// A new statement, so a new snapshot: it sees the commits the
		// insert waited for.
		claimSelect: `SELECT key, payload_hash, processed_at, expires_at <= now()
FROM ` + t + `
WHERE scope = $1 AND key = ANY($2::text[])
ORDER BY key
FOR UPDATE`,
		claimRenew: `UPDATE ` + t + `
SET payload_hash = $3, processed_at = now(), expires_at = now() + $4 * interval '1 microsecond'
WHERE scope = $1 AND key = $2`,
		unclaim: `DELETE FROM ` + t + ` WHERE scope = $1 AND key = $2`,
		inspect: `SELECT payload_hash, processed_at, expires_at FROM ` + t + ` WHERE scope = $1 AND key = $2`,
		cleanup: `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
SELECT ctid FROM ` + t + ` WHERE expires_at <= now()
LIMIT $1 FOR UPDATE SKIP LOCKED))`,
	}
}

func (s *Store) claim(ctx context.Context, tx pgx.Tx, scope string, recs []dedup.Record) ([]dedup.Claim, error) {
	cs, err := sqlstore.Claim(ctx, pgClaim{s: s, tx: tx, scope: scope}, recs, 0)
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
}

func (c pgClaim) Insert(ctx context.Context, recs []dedup.Record) (map[string]bool, error) {
	keys := make([]string, len(recs))
	hashes := make([][]byte, len(recs))
	for i, r := range recs {
		keys[i], hashes[i] = r.Key, r.PayloadHash[:]
	}
	rows, err := c.tx.Query(ctx, c.s.q.claimInsert, c.scope, keys, hashes, c.s.cfg.Retention.Microseconds())
	if err != nil {
		return nil, err
	}
	inserted := make(map[string]bool, len(recs))
	var k string
	_, err = pgx.ForEachRow(rows, []any{&k}, func() error { inserted[k] = true; return nil })
	return inserted, err
}

func (c pgClaim) Lookup(ctx context.Context, recs []dedup.Record) (map[string]sqlstore.Found, error) {
	keys := make([]string, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	rows, err := c.tx.Query(ctx, c.s.q.claimSelect, c.scope, keys)
	if err != nil {
		return nil, err
	}
	found := make(map[string]sqlstore.Found, len(recs))
	var (
		k string
		h []byte
		f sqlstore.Found
	)
	_, err = pgx.ForEachRow(rows, []any{&k, &h, &f.At, &f.Expired}, func() error {
		var err error
		f.Hash, err = dedup.HashFromBytes(h)
		found[k] = f
		return err
	})
	return found, err
}

func (c pgClaim) Renew(ctx context.Context, r dedup.Record) error {
	_, err := c.tx.Exec(ctx, c.s.q.claimRenew, c.scope, r.Key, r.PayloadHash[:], c.s.cfg.Retention.Microseconds())
	return err
}
