package outbox

import (
	"context"
	"encoding/json"
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
	if err := cfg.validate(argError("outbox.NewRelay(pool)", pool == nil), argError("outbox.NewRelay(pub)", pub == nil)); err != nil {
		return nil, err
	}
	st := &pgStore{pool: pool, table: cfg.Schema.table()}
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
	pool   *pgxpool.Pool
	table  string        // the outbox table's name, qualified with its schema
	listen *pgxpool.Conn // the LISTEN connection, nil until the first wait
	parts  *pgpart.Table // the table's partitions (Config.Partitioned), else nil
}

// claimSQL selects the eligible rows: pending, due, and the oldest pending
// row of their key (rows without a key are not ordered); $1 is the most to
// select. On PostgreSQL, rows another relay locked are skipped; their key's
// later rows are not eligible, because the locked row is still pending.
// On SQLite (one relay at a time), $2 is the time now in Unix milliseconds.
func claimSQL(table string, postgres bool) string {
	now, lock := "$2", ""
	if postgres {
		now, lock = "now()", "\nFOR UPDATE OF o SKIP LOCKED"
	}
	return `SELECT o.seq, o.attempts, o.id, o.destination, o.partition_key, o.routing_key, o.headers, o.body
FROM ` + table + ` o
WHERE o.state = 0
  AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= ` + now + `)
  AND (o.partition_key = '' OR NOT EXISTS (
        SELECT 1 FROM ` + table + ` p
        WHERE p.state = 0 AND p.partition_key = o.partition_key AND p.seq < o.seq))
ORDER BY o.seq
LIMIT $1` + lock
}

// claimBatch opens a transaction on a connection of its own and claims
// the rows in it: BEGIN and the claim go out in one round trip.
func (s *pgStore) claimBatch(ctx context.Context, n int) (claim, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(claimSQL(s.table, true), n)
	br := conn.SendBatch(ctx, b)
	out, err := scanClaim(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	c := &pgClaim{conn: conn, table: s.table, claimed: out}
	if err != nil {
		c.abort(ctx)
		return nil, err
	}
	return c, nil
}

// scanClaim reads the results of BEGIN and claimSQL.
func scanClaim(br pgx.BatchResults) ([]row, error) {
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanClaimed(rows.Next, rows.Scan, rows.Err)
}

// scanClaimed reads the rows of claimSQL.
func scanClaimed(next func() bool, scan func(dest ...any) error, rowsErr func() error) ([]row, error) {
	var out []row
	for next() {
		var r row
		var headers string
		if err := scan(&r.seq, &r.attempts, &r.msg.ID, &r.msg.Destination, &r.msg.Key, &r.msg.RoutingKey, &headers, &r.msg.Body); err != nil {
			return nil, err
		}
		if err := decodeHeaders(headers, &r.msg); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rowsErr()
}

// decodeHeaders decodes a row's headers column into m.Headers.
func decodeHeaders(s string, m *Message) error {
	if s == "" || s == "{}" {
		return nil
	}
	if err := json.Unmarshal([]byte(s), &m.Headers); err != nil {
		return fmt.Errorf("decode headers of %s: %w", m.ID, err)
	}
	return nil
}

// pgClaim is a claimed batch: its rows are locked by the transaction open
// on conn until finish commits it or abort rolls it back; both give conn
// back to the pool.
type pgClaim struct {
	conn    *pgxpool.Conn
	table   string
	claimed []row
}

func (c *pgClaim) rows() []row { return c.claimed }

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
	// The broker confirmed: record it even if ctx is being cancelled, so a
	// shutting-down relay does not publish these rows again.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	defer c.abort(ctx) // after a failure; a no-op after the commit
	b := &pgx.Batch{}
	if len(sent) > 0 {
		if deleteSent {
			b.Queue(`DELETE FROM `+c.table+` WHERE seq = ANY($1)`, sent)
		} else {
			b.Queue(`UPDATE `+c.table+` SET state = 1, sent_at = now() WHERE seq = ANY($1)`, sent)
		}
	}
	for _, f := range failed {
		state := statePending
		if f.park {
			state = stateParked
		}
		b.Queue(`UPDATE `+c.table+` SET attempts = attempts + 1, last_error = $2, state = $3,
			next_attempt_at = now() + make_interval(secs => $4) WHERE seq = $1`,
			f.seq, f.err, state, f.nextRetry.Seconds())
	}
	b.Queue(`COMMIT`)
	br := c.conn.SendBatch(ctx, b)
	var err error
	for range b.Len() - 1 {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	if err == nil {
		var tag pgconn.CommandTag
		if tag, err = br.Exec(); err == nil && tag.String() != "COMMIT" {
			err = pgx.ErrTxCommitRollback // the transaction had failed: nothing recorded
		}
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
	switch {
	case err == nil, wctx.Err() != nil && ctx.Err() == nil:
		return nil // notified, or polled
	case ctx.Err() != nil:
		return nil
	}
	// The connection broke: drop it and listen again next time.
	_ = s.listen.Conn().Close(context.Background())
	s.listen.Release()
	s.listen = nil
	return err
}

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
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.table+` WHERE seq IN (
		SELECT seq FROM `+s.table+` WHERE state = 1 AND sent_at < now() - make_interval(secs => $1)
		LIMIT $2 FOR UPDATE SKIP LOCKED)`, retention.Seconds(), n)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
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

func (s *pgStore) counts(ctx context.Context) (Counts, error) {
	return scanCounts(s.pool.QueryRow(ctx, countsSQL(s.table, true)).Scan)
}

func (s *pgStore) failures(ctx context.Context, n int) ([]FailureGroup, error) {
	rows, err := s.pool.Query(ctx, failuresSQL(s.table), n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanFailures(rows.Next, rows.Scan, rows.Err)
}

func (s *pgStore) parked(ctx context.Context, ids []string, n int) ([]ParkedRow, error) {
	var limit *int
	if n > 0 {
		limit = &n
	}
	rows, err := s.pool.Query(ctx, `SELECT id, destination, routing_key, partition_key, attempts, coalesce(last_error, ''), created_at
		FROM `+s.table+` WHERE state = 2 AND ($1::text[] IS NULL OR id = ANY($1))
		ORDER BY seq LIMIT $2`, ids, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedRow, error) {
		var p ParkedRow
		err := r.Scan(&p.ID, &p.Destination, &p.RoutingKey, &p.Key, &p.Attempts, &p.LastError, &p.Created)
		return p, err
	})
}

func (s *pgStore) unpark(ctx context.Context, ids []string) (int64, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.table+` SET state = 0, attempts = 0, next_attempt_at = NULL
		WHERE state = 2 AND ($1::text[] IS NULL OR id = ANY($1))`, ids)
	if err != nil {
		return 0, err
	}
	n := tag.RowsAffected()
	if n > 0 {
		// An update fires no insert trigger: wake the relays.
		if _, err := s.pool.Exec(ctx, `SELECT pg_notify($1, '')`, Channel); err != nil {
			return n, err
		}
	}
	return n, nil
}

func (s *pgStore) close() {
	if s.listen != nil {
		s.listen.Release()
		s.listen = nil
	}
}
