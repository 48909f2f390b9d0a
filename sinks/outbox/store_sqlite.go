package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup/migrate"
)

// NewSQLiteRelay returns a relay over the outbox table of a SQLite
// database, publishing through pub. Run one relay per database: SQLite has
// no row locks, so two relays would publish the same rows. The relay polls
// every PollInterval; it holds no transaction while it publishes, so
// handlers keep writing meanwhile.
func NewSQLiteRelay(db *sql.DB, pub Publisher, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	var sqliteConcurrency *idemq.ConfigError
	if cfg.Concurrency > 1 {
		sqliteConcurrency = &idemq.ConfigError{Field: "outbox.Config.Concurrency", Reason: "a SQLite relay has Concurrency 1"}
	}
	var sqliteSchema *idemq.ConfigError
	if cfg.Schema != "" {
		sqliteSchema = &idemq.ConfigError{Field: "outbox.Config.Schema", Reason: "SQLite has no schemas"}
	}
	if err := cfg.validate(argError("outbox.NewSQLiteRelay(db)", db == nil), argError("outbox.NewSQLiteRelay(pub)", pub == nil), sqliteConcurrency, sqliteSchema); err != nil {
		return nil, err
	}
	return newRelay(&sqliteStore{db: db}, pub, cfg, false), nil
}

// sqliteStore is the relay's store on SQLite; times are Unix milliseconds.
type sqliteStore struct {
	db *sql.DB
}

func nowMillis() int64 { return time.Now().UnixMilli() }

func (s *sqliteStore) claimBatch(ctx context.Context, n int) (claim, error) {
	rows, err := s.db.QueryContext(ctx, claimSQL(Table, false), n, nowMillis())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out, err := scanClaimed(rows.Next, rows.Scan, rows.Err)
	if err != nil {
		return nil, err
	}
	return &sqliteClaim{db: s.db, claimed: out}, nil
}

type sqliteClaim struct {
	db      *sql.DB
	claimed []row
}

func (c *sqliteClaim) rows() []row { return c.claimed }

func (c *sqliteClaim) abort(context.Context) {}

func (c *sqliteClaim) finish(ctx context.Context, sent []int64, failed []failure, deleteSent bool) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	now := nowMillis()
	for _, seq := range sent {
		if deleteSent {
			_, err = tx.ExecContext(ctx, `DELETE FROM `+Table+` WHERE seq = $1`, seq)
		} else {
			_, err = tx.ExecContext(ctx, `UPDATE `+Table+` SET state = 1, sent_at = $2 WHERE seq = $1`, seq, now)
		}
		if err != nil {
			return err
		}
	}
	for _, f := range failed {
		state := statePending
		if f.park {
			state = stateParked
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+Table+` SET attempts = attempts + 1, last_error = $2, state = $3,
			next_attempt_at = $4 WHERE seq = $1`, f.seq, f.err, state, now+f.nextRetry.Milliseconds()); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func (s *sqliteStore) wait(ctx context.Context, d time.Duration) error {
	sleep(ctx, d)
	return nil
}

func (s *sqliteStore) cleanup(ctx context.Context, retention time.Duration, n int) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM `+Table+` WHERE seq IN (
		SELECT seq FROM `+Table+` WHERE state = 1 AND sent_at < $1 LIMIT $2)`, nowMillis()-retention.Milliseconds(), n)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s *sqliteStore) counts(ctx context.Context) (Counts, error) {
	return Schema("").Counts(ctx, s.db, migrate.SQLite)
}

func (s *sqliteStore) failures(ctx context.Context, n int) ([]FailureGroup, error) {
	rows, err := s.db.QueryContext(ctx, failuresSQL(Table), n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanFailures(rows.Next, rows.Scan, rows.Err)
}

// idsArg is ids as a JSON array for json_each, or NULL for nil.
func idsArg(ids []string) (any, error) {
	if ids == nil {
		return nil, nil
	}
	b, err := json.Marshal(ids)
	return string(b), err
}

func (s *sqliteStore) parked(ctx context.Context, ids []string, n int) ([]ParkedRow, error) {
	arg, err := idsArg(ids)
	if err != nil {
		return nil, err
	}
	if n < 1 {
		n = -1 // no limit
	}
	rows, err := s.db.QueryContext(ctx, `SELECT id, destination, routing_key, partition_key, attempts, coalesce(last_error, ''), created_at
		FROM `+Table+` WHERE state = 2 AND ($1 IS NULL OR id IN (SELECT value FROM json_each($1)))
		ORDER BY seq LIMIT $2`, arg, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ParkedRow
	for rows.Next() {
		var p ParkedRow
		var created int64
		if err := rows.Scan(&p.ID, &p.Destination, &p.RoutingKey, &p.Key, &p.Attempts, &p.LastError, &created); err != nil {
			return nil, err
		}
		p.Created = time.UnixMilli(created)
		out = append(out, p)
	}
	return out, rows.Err()
}

func (s *sqliteStore) unpark(ctx context.Context, ids []string) (int64, error) {
	arg, err := idsArg(ids)
	if err != nil {
		return 0, err
	}
	res, err := s.db.ExecContext(ctx, `UPDATE `+Table+` SET state = 0, attempts = 0, next_attempt_at = NULL
		WHERE state = 2 AND ($1 IS NULL OR id IN (SELECT value FROM json_each($1)))`, arg)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s *sqliteStore) close() {}
