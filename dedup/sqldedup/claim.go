package sqldedup

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

func (s *Store) claim(ctx context.Context, tx *sql.Tx, scope string, recs []dedup.Record) ([]dedup.Claim, error) {
	cs, err := sqlstore.Claim(ctx, sqlClaim{s: s, tx: tx, scope: scope}, recs, maxKeysPerStatement)
	if err != nil {
		return nil, fmt.Errorf("sqldedup: %w", err)
	}
	return cs, nil
}

// sqlClaim runs the statements of one claim in tx.
type sqlClaim struct {
	s     *Store
	tx    *sql.Tx
	scope string
}

func (c sqlClaim) Insert(ctx context.Context, recs []dedup.Record) (map[string]bool, error) {
	query, args := c.s.q.insertClaims(c.scope, recs, time.Now(), c.s.cfg.Retention)
	rows, err := c.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	inserted := make(map[string]bool, len(recs))
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		inserted[k] = true
	}
	return inserted, rows.Err()
}

func (c sqlClaim) Lookup(ctx context.Context, recs []dedup.Record) (map[string]sqlstore.Found, error) {
	query, args := c.s.q.selectClaims(c.scope, recs, time.Now())
	rows, err := c.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	found := make(map[string]sqlstore.Found, len(recs))
	for rows.Next() {
		var (
			k  string
			h  []byte
			at int64
			f  sqlstore.Found
		)
		if err := rows.Scan(&k, &h, &at, &f.Expired, &f.Result); err != nil {
			return nil, err
		}
		if f.Hash, err = dedup.HashFromBytes(h); err != nil {
			return nil, err
		}
		f.At = time.UnixMicro(at)
		found[k] = f
	}
	return found, rows.Err()
}

func (c sqlClaim) Renew(ctx context.Context, r dedup.Record) error {
	query, args := c.s.q.renew(c.scope, r.Key, r.PayloadHash, time.Now(), c.s.cfg.Retention)
	_, err := c.tx.ExecContext(ctx, query, args...)
	return err
}
