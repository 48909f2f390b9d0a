package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/pgpart"
)

// NewRelay returns a relay over the outbox table of a PostgreSQL database
// (in Config.Schema, else found through the pool's search_path), publishing
// through pub. It uses one connection of pool to LISTEN and one per batch
// in flight: up to two per claim loop (Config.Concurrency), one for the
// batch being recorded and one for the next, and one for the cleanup loop
// while it runs. With fewer connections in the pool the loops wait for
// them.
func NewRelay(pool *pgxpool.Pool, pub Publisher, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(invalid(pool == nil, "outbox.NewRelay(pool)", "required"), invalid(pub == nil, "outbox.NewRelay(pub)", "required")); err != nil {
		return nil, err
	}
	st := &pgStore{sqlTable: sqlTable{postgres(cfg.Schema.table()), pgDB{pool}}, pool: pool}
	if cfg.Partitioned {
		st.parts = &pgpart.Table{
			DB: pool, Schema: string(cfg.Schema), Name: Table, LockKey: "idemq.outbox.cleanup:" + st.table,
			Retention: max(cfg.Retention, 0), Now: time.Now, Kept: st.kept, Prefix: "outbox", Logger: cfg.Logger,
		}
	}
	return newRelay(st, pub, cfg, true), nil
}

// pgStore is the relay's store on PostgreSQL.
type pgStore struct {
	sqlTable
	pool   *pgxpool.Pool
	listen *pgxpool.Conn // the LISTEN connection, nil until the first wait
	parts  *pgpart.Table // the table's partitions (Config.Partitioned), else nil
}

// pgDB runs statements on a pool.
type pgDB struct{ pool *pgxpool.Pool }

func (d pgDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := d.pool.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (d pgDB) query(ctx context.Context, q string, args ...any) (rows, error) {
	return d.pool.Query(ctx, q, args...)
}

// claimBatch opens a transaction on a connection of its own and claims
// the rows in it: BEGIN and the claim go out in one round trip.
func (s *pgStore) claimBatch(ctx context.Context, n int) ([]row, claim, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(s.claimSQL(), n)
	br := conn.SendBatch(ctx, b)
	c := &pgClaim{conn: conn, dialect: s.dialect}
	rows, err := scanClaim(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		c.abort(ctx)
		return nil, nil, err
	}
	return rows, c, nil
}

// scanClaim reads the results of BEGIN and claimSQL.
func scanClaim(br pgx.BatchResults) ([]row, error) {
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	rs, err := br.Query()
	return scanAll(rs, err, scanClaimed)
}

// pgClaim is a claimed batch: its rows are locked by the transaction open
// on conn until finish commits it or abort rolls it back; both give conn
// back to the pool.
type pgClaim struct {
	dialect
	conn *pgxpool.Conn
}

func (c *pgClaim) abort(ctx context.Context) {
	if c.conn == nil {
		return
	}
	// A connection still in a transaction when released (the ROLLBACK
	// failed) is closed by the pool, which rolls the transaction back.
	_, _ = c.conn.Exec(context.WithoutCancel(ctx), `ROLLBACK`)
	c.conn.Release()
	c.conn = nil
}

// finish records the outcome and commits in one round trip.
func (c *pgClaim) finish(ctx context.Context, sent []int64, failed []failure, deleteSent bool) error {
	defer c.abort(ctx) // after a failure; a no-op after the commit
	b := &pgx.Batch{}
	for _, st := range c.finishSQL(sent, failed, deleteSent) {
		b.Queue(st.sql, st.args...)
	}
	b.Queue(`COMMIT`)
	br := c.conn.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	var err error
	for range b.Len() {
		if tag, err = br.Exec(); err != nil {
			break
		}
	}
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback // the transaction had failed: nothing recorded
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	c.conn.Release()
	c.conn = nil
	return nil
}

func (s *pgStore) wait(ctx context.Context, d time.Duration) error {
	if s.listen == nil {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
			conn.Release()
			return err
		}
		s.listen = conn
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := s.listen.Conn().WaitForNotification(wctx)
	if err == nil || wctx.Err() != nil || ctx.Err() != nil {
		return nil // notified, polled, or stopped
	}
	// The connection broke: drop it and listen again next time.
	_ = s.listen.Conn().Close(context.Background())
	s.listen.Release()
	s.listen = nil
	return err
}

// cleanup drops the partitions of a partitioned table (Config.Partitioned)
// instead of deleting rows.
func (s *pgStore) cleanup(ctx context.Context, retention time.Duration, n int) (int64, error) {
	if s.parts != nil {
		if p, err := s.parts.Partitioned(ctx, s.pool); err != nil || p {
			if err != nil {
				return 0, err
			}
			dropped, _, err := s.parts.Maintain(ctx)
			return dropped, err
		}
	}
	return s.sqlTable.cleanup(ctx, retention, n)
}

// keptSQL finds a row of a partition ($1 the time now, $2 the retention in
// seconds) that the relay still needs: pending, parked, or sent less than
// the retention ago.
const keptSQL = `SELECT EXISTS (SELECT FROM %s WHERE state <> 1 OR sent_at > $1::timestamptz - make_interval(secs => $2))`

// kept reports whether partition holds a row the relay still needs. A
// partition found without one is locked against writes and looked at
// again: a reply re-armed since (Schema.Reply) is pending again.
func (s *pgStore) kept(ctx context.Context, tx pgx.Tx, partition string, now time.Time) (kept bool, err error) {
	q := fmt.Sprintf(keptSQL, partition)
	if err := tx.QueryRow(ctx, q, now, s.parts.Retention.Seconds()).Scan(&kept); err != nil || kept {
		return kept, err
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+partition+` IN SHARE MODE`); err != nil {
		return false, err
	}
	err = tx.QueryRow(ctx, q, now, s.parts.Retention.Seconds()).Scan(&kept)
	return kept, err
}

// unpark also wakes the relays: an update fires no insert trigger.
func (s *pgStore) unpark(ctx context.Context, ids []string) (int64, error) {
	n, err := s.sqlTable.unpark(ctx, ids)
	if err == nil && n > 0 {
		_, err = s.pool.Exec(ctx, `SELECT pg_notify($1, '')`, Channel)
	}
	return n, err
}

func (s *pgStore) close() {
	if s.listen != nil {
		s.listen.Release()
		s.listen = nil
	}
}
