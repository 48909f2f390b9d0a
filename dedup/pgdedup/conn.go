package pgdedup

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// conn adapts the store's DB, or a transaction it began (a pgx.Tx is a DB
// too), to sqlstore.DB and sqlstore.Tx, which run the statements pgdedup
// shares with sqldedup.
type conn struct{ db DB }

func (c conn) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := c.db.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (c conn) Query(ctx context.Context, sql string, args ...any) (sqlstore.ScanRows, error) {
	rows, err := c.db.Query(ctx, sql, args...)
	return closer{rows}, err
}

func (c conn) QueryRow(ctx context.Context, sql string, args ...any) sqlstore.Row {
	return c.db.QueryRow(ctx, sql, args...)
}

func (c conn) Begin(ctx context.Context) (sqlstore.Tx, error) {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return conn{tx}, nil
}

func (c conn) Commit(ctx context.Context) error   { return c.db.(pgx.Tx).Commit(ctx) }
func (c conn) Rollback(ctx context.Context) error { return c.db.(pgx.Tx).Rollback(ctx) }

// closer gives pgx.Rows the Close of sqlstore.ScanRows, which returns the
// error that ended the rows.
type closer struct{ pgx.Rows }

func (r closer) Close() error {
	r.Rows.Close()
	return r.Err()
}
