package sqldedup

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemq/idemq/dedup"
)

// maxClaimRounds bounds the insert/select loop of claim: a key that is
// neither inserted nor found was deleted by the janitor in between, which can
// happen at most once per expired record.
const maxClaimRounds = 3

func (s *Store) claim(ctx context.Context, tx *sql.Tx, scope string, recs []dedup.Record) ([]dedup.Claim, error) {
	claims := make([]dedup.Claim, len(recs))
	index := make(map[string]int, len(recs))
	for i, r := range recs {
		if _, dup := index[r.Key]; dup {
			return nil, fmt.Errorf("sqldedup: key %q appears twice in one claim", r.Key)
		}
		index[r.Key] = i
		claims[i].Key = r.Key
	}
	pending := slices.Clone(recs)
	slices.SortFunc(pending, func(a, b dedup.Record) int { return strings.Compare(a.Key, b.Key) })

	for round := 0; len(pending) > 0; round++ {
		if round == maxClaimRounds {
			return nil, fmt.Errorf("sqldedup: claim of %d key(s) did not settle after %d rounds", len(pending), round)
		}
		now := time.Now()
		var rest []dedup.Record
		for chunk := range slices.Chunk(pending, maxKeysPerStatement) {
			inserted, err := s.insertKeys(ctx, tx, scope, chunk, now)
			if err != nil {
				return nil, err
			}
			for _, r := range chunk {
				if inserted[r.Key] {
					claims[index[r.Key]].State = dedup.StateNew
				} else {
					rest = append(rest, r)
				}
			}
		}
		pending = pending[:0]
		for chunk := range slices.Chunk(rest, maxKeysPerStatement) {
			vanished, err := s.resolveExisting(ctx, tx, scope, chunk, claims, index, now)
			if err != nil {
				return nil, err
			}
			pending = append(pending, vanished...)
		}
	}
	return claims, nil
}

// insertKeys inserts the records of recs that have none and returns their
// keys.
func (s *Store) insertKeys(ctx context.Context, tx *sql.Tx, scope string, recs []dedup.Record, now time.Time) (map[string]bool, error) {
	query, args := s.q.insertClaims(scope, recs, now, s.cfg.Retention)
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqldedup: claim: %w", err)
	}
	defer rows.Close()
	inserted := make(map[string]bool, len(recs))
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, fmt.Errorf("sqldedup: claim: %w", err)
		}
		inserted[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqldedup: claim: %w", err)
	}
	return inserted, nil
}

// resolveExisting classifies keys that were already recorded, renews expired
// records, and returns the records that vanished in between.
func (s *Store) resolveExisting(ctx context.Context, tx *sql.Tx, scope string, recs []dedup.Record,
	claims []dedup.Claim, index map[string]int, now time.Time) ([]dedup.Record, error) {
	type found struct {
		hash    dedup.Hash
		at      time.Time
		expired bool
	}
	existing, err := func() (map[string]found, error) {
		keys := make([]string, len(recs))
		for i, r := range recs {
			keys[i] = r.Key
		}
		query, args := s.q.selectClaims(scope, keys, now)
		rows, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		existing := make(map[string]found, len(recs))
		for rows.Next() {
			var (
				k       string
				h       []byte
				at      int64
				expired bool
			)
			if err := rows.Scan(&k, &h, &at, &expired); err != nil {
				return nil, err
			}
			hash, err := dedup.HashFromBytes(h)
			if err != nil {
				return nil, err
			}
			existing[k] = found{hash: hash, at: time.UnixMicro(at), expired: expired}
		}
		return existing, rows.Err()
	}()
	if err != nil {
		return nil, fmt.Errorf("sqldedup: claim lookup: %w", err)
	}

	var vanished []dedup.Record
	for _, r := range recs {
		c := &claims[index[r.Key]]
		f, ok := existing[r.Key]
		switch {
		case !ok:
			vanished = append(vanished, r)
		case f.expired:
			query, args := s.q.renew(scope, r.Key, r.PayloadHash, now, s.cfg.Retention)
			if _, err := tx.ExecContext(ctx, query, args...); err != nil {
				return nil, fmt.Errorf("sqldedup: renew expired record: %w", err)
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
