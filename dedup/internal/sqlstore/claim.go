package sqlstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemq/idemq/dedup"
)

// Found is an existing record, as a claim's lookup returns it.
type Found struct {
	Hash    dedup.Hash
	At      time.Time
	Expired bool
	Result  []byte // stored with the record, nil when none
}

// ClaimOps are the statements of one claim, run in the caller's
// transaction. Each store implements them in its own SQL.
type ClaimOps interface {
	// Insert records every one of recs (sorted by key) that has no record
	// yet, in that order, waiting for uncommitted conflicting records, and
	// returns the keys it inserted.
	Insert(ctx context.Context, recs []dedup.Record) (map[string]bool, error)
	// Lookup returns the records of recs that exist, locked for the rest of
	// the transaction. It must run as a new statement (a new snapshot), so
	// that it sees the commits Insert waited for.
	Lookup(ctx context.Context, recs []dedup.Record) (map[string]Found, error)
	// Renew overwrites an expired record with rec, as if it were new (and
	// without a result).
	Renew(ctx context.Context, rec dedup.Record) error
}

// MaxClaimRounds bounds the insert and lookup rounds of Claim: a key that is
// neither inserted nor found was deleted by the janitor in between, which can
// happen at most once per expired record.
const MaxClaimRounds = 3

// Claim is the claim algorithm of the SQL stores. It inserts the keys of recs
// in ascending order (so concurrent claims lock them in one order), classifies
// the keys already recorded as done, mismatch, or expired (renewed and then
// new), and claims again the keys whose record vanished in between. chunk
// bounds the keys per statement; 0 means no bound. The claims are returned
// in the order of recs; recs must not contain a key twice.
func Claim(ctx context.Context, ops ClaimOps, recs []dedup.Record, chunk int) ([]dedup.Claim, error) {
	claims := make([]dedup.Claim, len(recs))
	// A claim of one key (every message at batch 1) needs no index and no
	// sort.
	var index map[string]int
	if len(recs) > 1 {
		index = make(map[string]int, len(recs))
	}
	for i, r := range recs {
		if index != nil {
			if _, dup := index[r.Key]; dup {
				return nil, fmt.Errorf("key %q appears twice in one claim", r.Key)
			}
			index[r.Key] = i
		}
		claims[i].Key = r.Key
	}
	at := func(key string) int {
		if index == nil {
			return 0
		}
		return index[key]
	}
	if chunk <= 0 {
		chunk = max(len(recs), 1)
	}
	pending := recs // read only: the keys to claim again go to a new slice
	if len(recs) > 1 {
		pending = slices.Clone(recs)
		slices.SortFunc(pending, func(a, b dedup.Record) int { return strings.Compare(a.Key, b.Key) })
	}

	for round := 0; len(pending) > 0; round++ {
		if round == MaxClaimRounds {
			return nil, fmt.Errorf("claim of %d key(s) did not settle after %d rounds", len(pending), round)
		}
		var existing []dedup.Record
		for part := range slices.Chunk(pending, chunk) {
			inserted, err := ops.Insert(ctx, part)
			if err != nil {
				return nil, fmt.Errorf("claim: %w", err)
			}
			for _, r := range part {
				if inserted[r.Key] {
					claims[at(r.Key)].State = dedup.StateNew
				} else {
					existing = append(existing, r)
				}
			}
		}
		pending = nil
		for part := range slices.Chunk(existing, chunk) {
			found, err := ops.Lookup(ctx, part)
			if err != nil {
				return nil, fmt.Errorf("claim lookup: %w", err)
			}
			for _, r := range part {
				c := &claims[at(r.Key)]
				f, ok := found[r.Key]
				switch {
				case !ok:
					pending = append(pending, r) // vanished: claim it again
				case f.Expired:
					if err := ops.Renew(ctx, r); err != nil {
						return nil, fmt.Errorf("renew expired record: %w", err)
					}
					c.State = dedup.StateNew
				case f.Hash == r.PayloadHash:
					c.State, c.StoredHash, c.ProcessedAt, c.Result = dedup.StateDone, f.Hash, f.At, f.Result
				default:
					c.State, c.StoredHash, c.ProcessedAt = dedup.StateMismatch, f.Hash, f.At
				}
			}
		}
	}
	return claims, nil
}

// MarkProcessed is MarkProcessedTx of the SQL stores: it claims the record
// of key with payload's digest through claim, which runs in the caller's
// transaction, and returns a *dedup.MismatchError for another payload.
func MarkProcessed(scope, key string, payload []byte, claim func([]dedup.Record) ([]dedup.Claim, error)) (dedup.State, error) {
	rec := dedup.Record{Key: key, PayloadHash: dedup.HashPayload(payload)}
	claims, err := claim([]dedup.Record{rec})
	if err != nil {
		return 0, err
	}
	c := claims[0]
	if c.State == dedup.StateMismatch {
		return c.State, &dedup.MismatchError{Scope: scope, Key: key, Stored: c.StoredHash, Received: rec.PayloadHash}
	}
	return c.State, nil
}
