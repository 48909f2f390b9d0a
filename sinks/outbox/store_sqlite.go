package outbox

import (
	"context"
	"database/sql"
	"time"
)

// NewSQLiteRelay returns a relay over the outbox table of a SQLite
// database, publishing through pub. Run one relay per database: SQLite has
// no row locks, so two relays would publish the same rows. The relay polls
// every PollInterval; it holds no transaction while it publishes, so
// handlers keep writing meanwhile.
func NewSQLiteRelay(db *sql.DB, pub Publisher, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(invalid(db == nil, "outbox.NewSQLiteRelay(db)", "required"), invalid(pub == nil, "outbox.NewSQLiteRelay(pub)", "required"),
		invalid(cfg.Concurrency > 1, "outbox.Config.Concurrency", "a SQLite relay has Concurrency 1"),
		invalid(cfg.Schema != "", "outbox.Config.Schema", "SQLite has no schemas")); err != nil {
		return nil, err
	}
	return newRelay(&sqliteStore{sqlTable{sqlite, sqlDB{db}}, db}, pub, cfg, false), nil
}

// sqliteStore is the relay's store on SQLite; times are Unix milliseconds.
type sqliteStore struct {
	sqlTable
	db *sql.DB
}

// sqlDB runs statements on a database/sql DB.
type sqlDB struct{ db *sql.DB }

func (d sqlDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := d.db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (d sqlDB) query(ctx context.Context, q string, args ...any) (rows, error) {
	rs, err := d.db.QueryContext(ctx, q, args...)
	return sqlRows{rs}, err
}

// sqlRows are *sql.Rows as rows.
type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// claimBatch reads the rows to publish, without locking them (only one
// relay runs): the store is their claim.
func (s *sqliteStore) claimBatch(ctx context.Context, n int) ([]row, claim, error) {
	rs, err := s.run.query(ctx, s.claimSQL(), n)
	rows, err := scanAll(rs, err, scanClaimed)
	return rows, s, err
}

func (s *sqliteStore) abort(context.Context) {}

// finish records the outcome in a transaction.
func (s *sqliteStore) finish(ctx context.Context, sent []int64, failed []failure, deleteSent bool) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	for _, st := range s.finishSQL(sent, failed, deleteSent) {
		if _, err := tx.ExecContext(ctx, st.sql, st.args...); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func (s *sqliteStore) wait(ctx context.Context, d time.Duration) error {
	sleep(ctx, d)
	return nil
}

func (s *sqliteStore) close() {}
