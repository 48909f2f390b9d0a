package pgdedup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/pgpart"
)

// Partition maintenance of a partitioned table (Config.Partitioned).
const (
	// PartitionsAhead is how many days after the clock's day (UTC) Cleanup
	// keeps a partition for, so that a janitor outage of that long stops
	// no claim.
	PartitionsAhead = pgpart.Ahead
	// PartitionLockTimeout bounds the wait of each partition's DDL for its
	// table lock (lock_timeout). A drop needs the table's exclusive lock,
	// which claims queue behind while it waits: the timeout bounds that
	// queue. A step that timed out is tried twice more within the Cleanup,
	// 50 to 250 ms apart, then by the next Cleanup.
	PartitionLockTimeout = pgpart.LockTimeout
)

// parts returns the partition maintenance of the store's table: a
// partition is dropped when its day ended at least Retention ago and it
// holds no unexpired record (stores of other scopes on the table may keep
// theirs longer).
//
// The check reads the partition through its BRIN index on expires_at
// (migration 005), which leaves out the block ranges whose records all
// expired: the sequential scan is turned off for the rest of the step's
// transaction (DDL alone follows), as the planner prefers it for a
// partition without statistics, expecting an early match. Without the
// index the check is still the scan that the first unexpired record ends.
func (s *Store) parts() *pgpart.Table {
	return &pgpart.Table{
		DB: s.db, Schema: s.cfg.Schema, Name: s.cfg.Table, LockKey: s.shared.LockKey(),
		Retention: s.cfg.Retention, Now: s.cfg.Now, Prefix: "pgdedup", Logger: s.cfg.Logger,
		Kept: func(ctx context.Context, tx pgx.Tx, partition string, now time.Time) (kept bool, err error) {
			if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
				return false, err
			}
			err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+partition+` WHERE expires_at > $1)`, now).Scan(&kept)
			return kept, err
		},
	}
}
