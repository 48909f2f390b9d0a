package sqldedup

import (
	"context"
	"database/sql"

	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// querier adapts a Querier to sqlstore.Querier, which runs the statements
// sqldedup shares with pgdedup.
type querier struct{ q Querier }

func (c querier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := c.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (c querier) Query(ctx context.Context, query string, args ...any) (sqlstore.ScanRows, error) {
	rows, err := c.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

func (c querier) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return c.q.QueryRowContext(ctx, query, args...)
}

// conn adapts the store's DB to sqlstore.DB.
type conn struct {
	querier
	db DB
}

func (c conn) Begin(ctx context.Context) (sqlstore.Tx, error) {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return txConn{querier{tx}, tx}, nil
}

// txConn is a transaction of conn.
type txConn struct {
	querier
	tx *sql.Tx
}

func (t txConn) Commit(context.Context) error   { return t.tx.Commit() }
func (t txConn) Rollback(context.Context) error { return t.tx.Rollback() }
