package memdedup

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/idemq/idemq/dedup"
)

// StoreResults implements dedupdriver.Tx: each result is kept with the
// record of its key, which tx must have claimed as new; it becomes visible
// with the record at Commit and goes with it at Rollback.
func (s txDriver) StoreResults(ctx context.Context, tx *Tx, scope string, results []dedup.Result) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(tx); err != nil {
		return err
	}
	for _, res := range results {
		r := s.records[key{scope, res.Key}]
		if r == nil || r.owner != tx {
			return fmt.Errorf("memstore: result of key %q: the key is not claimed in transaction %d", res.Key, tx.id)
		}
		r.result = slices.Clone(res.Value)
	}
	return nil
}

// CompleteWithResult implements dedupdriver.Lease: Complete, keeping
// result with the done key.
func (ls *Leases) CompleteWithResult(ctx context.Context, scope, k, token string, retention time.Duration, result []byte) error {
	return ls.complete(ctx, scope, k, token, retention, slices.Clone(result))
}
