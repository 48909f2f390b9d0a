// Package pgtrace counts what a pgx connection sends PostgreSQL, for the
// benchmarks' and the stores' tests' round-trip figures.
package pgtrace

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Counter is a pgx tracer (pgx.QueryTracer and pgx.BatchTracer) counting
// round trips and statements: a query or an Exec (BEGIN and COMMIT
// included) is one round trip and one statement; a pipelined batch is one
// round trip and as many statements as it queues. Set it as a connection
// config's Tracer. It is safe for concurrent use.
type Counter struct {
	Trips, Statements atomic.Int64
}

var (
	_ pgx.QueryTracer = (*Counter)(nil)
	_ pgx.BatchTracer = (*Counter)(nil)
)

// TraceQueryStart counts a query.
func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.Trips.Add(1)
	c.Statements.Add(1)
	return ctx
}

// TraceQueryEnd does nothing.
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch.
func (c *Counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	c.Trips.Add(1)
	if d.Batch != nil {
		c.Statements.Add(int64(d.Batch.Len()))
	}
	return ctx
}

// TraceBatchQuery does nothing.
func (c *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
