package sqldedup

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemq/idemq/dedup"
)

// StoreResults implements dedupdriver.Tx: it writes each result into the
// record of its key, claimed in tx, one statement per result (database/sql
// has no portable array parameter). The result column (migration 003) is
// NULL for records without one. The store has no size limit of its own
// below the database's (1 GB for PostgreSQL's bytea and SQLite's default
// SQLITE_MAX_LENGTH): the runner's consumer.Config.MaxResultBytes is the
// limit.
func (s txDriver) StoreResults(ctx context.Context, tx *sql.Tx, scope string, results []dedup.Result) error {
	for _, r := range results {
		if _, err := tx.ExecContext(ctx, s.q.storeResult(), scope, r.Key, r.Value); err != nil {
			return fmt.Errorf("sqldedup: store result of %q: %w", r.Key, err)
		}
	}
	return nil
}
