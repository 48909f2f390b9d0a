package pgdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
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

// maxClaimRounds bounds the insert/select loop of claim: a key that is
// neither inserted nor found was deleted by the janitor in between, which can
// happen at most once per expired record.
const maxClaimRounds = 3

func (s *Store) claim(ctx context.Context, tx pgx.Tx, scope string, recs []dedup.Record) ([]dedup.Claim, error) {
	claims := make([]dedup.Claim, len(recs))
	index := make(map[string]int, len(recs))
	for i, r := range recs {
		if _, dup := index[r.Key]; dup {
			return nil, fmt.Errorf("pgdedup: key %q appears twice in one claim", r.Key)
		}
		index[r.Key] = i
		claims[i].Key = r.Key
	}
	retention := s.cfg.Retention.Microseconds()

	pending := recs
	for round := 0; len(pending) > 0; round++ {
		if round == maxClaimRounds {
			return nil, fmt.Errorf("pgdedup: claim of %d key(s) did not settle after %d rounds", len(pending), round)
		}
		keys := make([]string, len(pending))
		hashes := make([][]byte, len(pending))
		for i, r := range pending {
			keys[i] = r.Key
			hashes[i] = r.PayloadHash[:]
		}
		inserted, err := s.insertKeys(ctx, tx, scope, keys, hashes, retention)
		if err != nil {
			return nil, err
		}
		var rest []dedup.Record
		for _, r := range pending {
			if inserted[r.Key] {
				claims[index[r.Key]].State = dedup.StateNew
			} else {
				rest = append(rest, r)
			}
		}
		if len(rest) == 0 {
			break
		}
		pending, err = s.resolveExisting(ctx, tx, scope, rest, claims, index, retention)
		if err != nil {
			return nil, err
		}
	}
	return claims, nil
}

func (s *Store) insertKeys(ctx context.Context, tx pgx.Tx, scope string, keys []string, hashes [][]byte, retention int64) (map[string]bool, error) {
	rows, err := tx.Query(ctx, s.q.claimInsert, scope, keys, hashes, retention)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: claim: %w", err)
	}
	inserted := make(map[string]bool, len(keys))
	var k string
	_, err = pgx.ForEachRow(rows, []any{&k}, func() error { inserted[k] = true; return nil })
	if err != nil {
		return nil, fmt.Errorf("pgdedup: claim: %w", err)
	}
	return inserted, nil
}

// resolveExisting classifies keys that were already recorded, renews expired
// records, and returns the records that vanished in between.
func (s *Store) resolveExisting(ctx context.Context, tx pgx.Tx, scope string, recs []dedup.Record,
	claims []dedup.Claim, index map[string]int, retention int64) ([]dedup.Record, error) {
	keys := make([]string, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	rows, err := tx.Query(ctx, s.q.claimSelect, scope, keys)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: claim lookup: %w", err)
	}
	type found struct {
		hash    dedup.Hash
		at      time.Time
		expired bool
	}
	existing := make(map[string]found, len(recs))
	var (
		k       string
		h       []byte
		at      time.Time
		expired bool
	)
	_, err = pgx.ForEachRow(rows, []any{&k, &h, &at, &expired}, func() error {
		hash, err := dedup.HashFromBytes(h)
		if err != nil {
			return err
		}
		existing[k] = found{hash: hash, at: at, expired: expired}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgdedup: claim lookup: %w", err)
	}

	var vanished []dedup.Record
	for _, r := range recs {
		c := &claims[index[r.Key]]
		f, ok := existing[r.Key]
		switch {
		case !ok:
			vanished = append(vanished, r)
		case f.expired:
			if _, err := tx.Exec(ctx, s.q.claimRenew, scope, r.Key, r.PayloadHash[:], retention); err != nil {
				return nil, fmt.Errorf("pgdedup: renew expired record: %w", err)
			}
			c.State = dedup.StateNew
		case f.hash == r.PayloadHash:
			c.State, c.StoredHash, c.ProcessedAt = dedup.StateDone, f.hash, f.at
		default:
			c.State, c.StoredHash, c.ProcessedAt = dedup.StateMismatch, f.hash, f.at
		}
	}
	return vanished, nil
}
