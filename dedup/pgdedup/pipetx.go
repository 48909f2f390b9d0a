package pgdedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// errSavepointNotCreated reports that the savepoint of the message being
// rolled back was sent but never confirmed: rolling back cannot be trusted,
// so the whole transaction must fail.
var errSavepointNotCreated = errors.New("pgdedup: the message's savepoint was not created; the transaction must be rolled back")

// pipeTx is the pgx.Tx the store hands out. It defers the savepoint
// statements that guard each message of a batch and sends them in the same
// round trip as the handler's first statement, so a savepoint per message
// costs no extra round trip. Every way of reaching the connection (Exec,
// Query, QueryRow, SendBatch, CopyFrom, Prepare, Begin, LargeObjects, Conn)
// sends the pending statements first, so the handler's writes are always
// inside their savepoint.
//
// Each message's savepoint has its own name, and a rollback to a savepoint
// whose creation was not confirmed fails instead of rolling back further, so
// a failure can never undo an earlier message's work.
//
// Like any pgx.Tx it is used by one goroutine at a time.
type pipeTx struct {
	pgx.Tx
	n       int      // savepoints opened so far
	cur     string   // the current message's savepoint
	prev    string   // the previous message's savepoint, to release
	pending []string // savepoint statements not sent yet
	created bool     // cur was confirmed by the server
}

var _ pgx.Tx = (*pipeTx)(nil)

// openSavepoint queues the savepoint of the next message.
func (t *pipeTx) openSavepoint(releasePrevious bool) {
	if len(t.pending) > 0 {
		// The previous message sent nothing: its savepoint was never
		// created, and the queued statements already open the one that the
		// next message needs.
		return
	}
	if releasePrevious && t.created {
		t.pending = append(t.pending, "RELEASE SAVEPOINT "+t.cur)
	}
	t.n++
	t.prev, t.cur, t.created = t.cur, fmt.Sprintf("idemq_msg_%d", t.n), false
	t.pending = append(t.pending, "SAVEPOINT "+t.cur)
}

// rollbackToSavepoint undoes everything since the last openSavepoint.
func (t *pipeTx) rollbackToSavepoint(ctx context.Context) error {
	switch {
	case len(t.pending) > 0:
		return nil // nothing was sent since the savepoint was queued
	case !t.created:
		return errSavepointNotCreated
	}
	_, err := t.Tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+t.cur)
	return err
}

// flush sends the pending statements on their own.
func (t *pipeTx) flush(ctx context.Context) error {
	if len(t.pending) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, s := range t.pending {
		b.Queue(s)
	}
	t.pending = nil
	if err := t.Tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	t.created = true
	return nil
}

// withPending starts a batch holding the pending statements followed by one
// more, sends it, and reads the results of the pending ones.
func (t *pipeTx) withPending(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	for _, s := range t.pending {
		b.Queue(s)
	}
	b.Queue(sql, args...)
	n := len(t.pending)
	t.pending = nil
	br := t.Tx.SendBatch(ctx, b)
	for range n {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	t.created = true
	return br, nil
}

// Exec implements pgx.Tx. A statement without arguments may hold several
// statements (simple protocol), which a pipeline cannot carry: the pending
// statements are sent first, on their own.
func (t *pipeTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if len(args) == 0 {
		if err := t.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
	}
	if len(t.pending) == 0 {
		return t.Tx.Exec(ctx, sql, args...)
	}
	br, err := t.withPending(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	return tag, errors.Join(err, br.Close())
}

// Query implements pgx.Tx.
func (t *pipeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if len(t.pending) == 0 {
		return t.Tx.Query(ctx, sql, args...)
	}
	br, err := t.withPending(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, errors.Join(err, br.Close())
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow implements pgx.Tx.
func (t *pipeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if len(t.pending) == 0 {
		return t.Tx.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	return &batchRow{rows: rows, err: err}
}

// SendBatch implements pgx.Tx.
func (t *pipeTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.flush(ctx); err != nil {
		return errBatchResults{err}
	}
	return t.Tx.SendBatch(ctx, b)
}

// CopyFrom implements pgx.Tx.
func (t *pipeTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, cols, src)
}

// Prepare implements pgx.Tx.
func (t *pipeTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

// Begin implements pgx.Tx: a nested savepoint inside the message's own.
func (t *pipeTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

// LargeObjects implements pgx.Tx. Pending savepoint statements are sent
// first, with a background context since the method takes none.
func (t *pipeTx) LargeObjects() pgx.LargeObjects {
	_ = t.flush(context.Background())
	return t.Tx.LargeObjects()
}

// Conn implements pgx.Tx. Pending savepoint statements are sent first, so
// statements run directly on the connection stay inside the savepoint.
func (t *pipeTx) Conn() *pgx.Conn {
	_ = t.flush(context.Background())
	return t.Tx.Conn()
}

// Commit implements pgx.Tx. Pending savepoint statements are dropped:
// committing releases every savepoint.
func (t *pipeTx) Commit(ctx context.Context) error {
	t.pending = nil
	return t.Tx.Commit(ctx)
}

// Rollback implements pgx.Tx.
func (t *pipeTx) Rollback(ctx context.Context) error {
	t.pending = nil
	return t.Tx.Rollback(ctx)
}

// batchRows closes the batch that carried the query when the rows end.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	_ = r.br.Close()
}

// batchRow is pgx.Row over batchRows, with pgx's QueryRow semantics.
type batchRow struct {
	rows pgx.Rows
	err  error
}

func (r *batchRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// errBatchResults reports one error for every result of a batch that could
// not be sent.
type errBatchResults struct{ err error }

func (e errBatchResults) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, e.err }
func (e errBatchResults) Query() (pgx.Rows, error)         { return nil, e.err }
func (e errBatchResults) QueryRow() pgx.Row                { return &batchRow{err: e.err} }
func (e errBatchResults) Close() error                     { return e.err }
func (e errBatchResults) Tx() pgx.Tx                       { return nil }
