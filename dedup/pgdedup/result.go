package pgdedup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
)

// StoreResults implements dedup.ResultStorer: it writes each result into the
// record of its key, claimed in tx, in one statement (one round trip). The
// result column (migration 003) is NULL for records without one.
func (s *Store) StoreResults(ctx context.Context, tx pgx.Tx, scope string, results []dedup.Result) error {
	var err error
	switch len(results) {
	case 0:
		return nil
	case 1:
		_, err = tx.Exec(ctx, s.q.storeResult, scope, results[0].Key, results[0].Value)
	default:
		keys := make([]string, len(results))
		values := make([][]byte, len(results))
		for i, r := range results {
			keys[i], values[i] = r.Key, r.Value
		}
		_, err = tx.Exec(ctx, s.q.storeResults, scope, keys, values)
	}
	if err != nil {
		return fmt.Errorf("pgdedup: store results: %w", err)
	}
	return nil
}
