package sqldedup

import (
	"context"
	"database/sql"

	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// conn adapts the store's DB, or a transaction it began (tx), to
// sqlstore.DB and sqlstore.Tx, which run the statements sqldedup shares
// with pgdedup.
type conn struct {
	q  Querier
	tx *sql.Tx
}

func (c conn) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := c.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (c conn) Query(ctx context.Context, query string, args ...any) (sqlstore.ScanRows, error) {
	rows, err := c.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

func (c conn) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return c.q.QueryRowContext(ctx, query, args...)
}

func (c conn) Begin(ctx context.Context) (sqlstore.Tx, error) {
	tx, err := c.q.(DB).BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return conn{tx, tx}, nil
}

func (c conn) Commit(context.Context) error   { return c.tx.Commit() }
func (c conn) Rollback(context.Context) error { return c.tx.Rollback() }
