// Package pgload is what the PostgreSQL store benchmarks share to drive
// claims through a consumer.Runner at full speed and to report them: a
// source of new random keys as fast as the Runner takes them, a pgx tracer
// of claim and commit latency, the sizes and tuples of a table (partitions
// included) and the figures' formatting.
package pgload

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
)

// Source serves new messages with random keys, as fast as the Runner takes
// them, and counts the acknowledged ones. Keys counts the messages made
// (shared by the sources of one run); Key, when set, makes a key of 16
// random bytes (default: their hex, 32 characters).
type Source struct {
	Keys  *atomic.Int64
	Key   func(raw []byte) string
	Acked atomic.Int64
}

var _ consumer.Source = (*Source)(nil)

// Receive returns max new messages.
func (s *Source) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]*consumer.Message, max)
	raw := make([]byte, 16*max)
	_, _ = rand.Read(raw)
	now := time.Now()
	for i := range out {
		b := raw[16*i : 16*(i+1)]
		key := hex.EncodeToString(b)
		if s.Key != nil {
			key = s.Key(b)
		}
		n := s.Keys.Add(1)
		out[i] = &consumer.Message{ID: key, Key: key, Body: fmt.Appendf(nil, `{"n":%d}`, n), PartitionKey: key, Attempt: 1, ReceivedAt: now}
	}
	return out, nil
}

// Ack counts msgs.
func (s *Source) Ack(_ context.Context, msgs []*consumer.Message) error {
	s.Acked.Add(int64(len(msgs)))
	return nil
}

// Retry does nothing.
func (s *Source) Retry(context.Context, *consumer.Message, time.Duration) error { return nil }

// DeadLetter does nothing.
func (s *Source) DeadLetter(context.Context, *consumer.Message, error) error { return nil }

// Close does nothing.
func (s *Source) Close() error { return nil }

// UUID formats 16 bytes as a version 4 UUID (36 characters), the key most
// producers send.
func UUID(b []byte) string {
	var u [16]byte
	copy(u[:], b)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}

// Runner returns a Runner of the batch API (TransactionalBatch, its handler
// writing nothing else, so the transaction is the claim and the commit)
// reading src, named scope.
func Runner(src consumer.Source, store *pgdedup.Store, scope string, cfg consumer.Config) (*consumer.Runner, error) {
	path := consumer.TransactionalBatch(store, func(context.Context, pgx.Tx, []*consumer.Message) error { return nil })
	cfg.Name = scope
	return consumer.NewRunner(src, path, cfg)
}

// Sample is one traced round trip: when it ended and how long it took.
type Sample struct {
	End time.Time
	D   time.Duration
}

// Tracer records the latency of each claim (the pipelined BEGIN and
// INSERT: every batch) and of each COMMIT. Set it as the Runner's pool's
// Tracer.
type Tracer struct {
	mu             sync.Mutex
	claims, commit []Sample
}

var (
	_ pgx.QueryTracer = (*Tracer)(nil)
	_ pgx.BatchTracer = (*Tracer)(nil)
)

type startKey struct{}

// TraceQueryStart notes when a COMMIT starts.
func (t *Tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.EqualFold(d.SQL, "commit") {
		return context.WithValue(ctx, startKey{}, time.Now())
	}
	return ctx
}

// TraceQueryEnd records a COMMIT's latency.
func (t *Tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if s, ok := ctx.Value(startKey{}).(time.Time); ok {
		now := time.Now()
		t.mu.Lock()
		t.commit = append(t.commit, Sample{now, now.Sub(s)})
		t.mu.Unlock()
	}
}

// TraceBatchStart notes when a claim starts.
func (t *Tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, startKey{}, time.Now())
}

// TraceBatchQuery does nothing.
func (t *Tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd records a claim's latency.
func (t *Tracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if s, ok := ctx.Value(startKey{}).(time.Time); ok {
		now := time.Now()
		t.mu.Lock()
		t.claims = append(t.claims, Sample{now, now.Sub(s)})
		t.mu.Unlock()
	}
}

// Reset forgets what was recorded.
func (t *Tracer) Reset() { _, _ = t.TakeSamples() }

// Take returns the claim and commit latencies recorded since the last Take
// or Reset and forgets them.
func (t *Tracer) Take() (claims, commit []time.Duration) {
	c, m := t.TakeSamples()
	return Durations(c), Durations(m)
}

// TakeSamples is Take with each sample's end time.
func (t *Tracer) TakeSamples() (claims, commit []Sample) {
	t.mu.Lock()
	defer t.mu.Unlock()
	claims, commit = t.claims, t.commit
	t.claims, t.commit = nil, nil
	return claims, commit
}

// Durations returns the samples' latencies.
func Durations(ss []Sample) []time.Duration {
	out := make([]time.Duration, len(ss))
	for i, s := range ss {
		out[i] = s.D
	}
	return out
}

// Size is a table's heap and indexes, partitions included, and its tuples
// and vacuums as pg_stat_user_tables counts them.
type Size struct{ Table, Indexes, Live, Dead, Vacuums int64 }

// Sizes reads table's Size (a qualified name). It waits for the statistics
// first: each backend flushes them at most once a second.
func Sizes(ctx context.Context, db pgdedup.DBTX, table string) (Size, error) {
	time.Sleep(1500 * time.Millisecond)
	_, _ = db.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
	var sz Size
	// pg_partition_tree has no row for a table that is not partitioned.
	err := db.QueryRow(ctx, `WITH t AS (
  SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf
  UNION ALL SELECT oid FROM pg_class WHERE oid = $1::regclass AND relkind <> 'p')
SELECT coalesce(sum(pg_relation_size(t.relid)), 0)::int8, coalesce(sum(pg_indexes_size(t.relid)), 0)::int8,
       coalesce(sum(s.n_live_tup), 0)::int8, coalesce(sum(s.n_dead_tup), 0)::int8,
       coalesce(sum(s.autovacuum_count + s.vacuum_count), 0)::int8
FROM t LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid`, table).Scan(&sz.Table, &sz.Indexes, &sz.Live, &sz.Dead, &sz.Vacuums)
	if err != nil {
		return sz, fmt.Errorf("sizes of %s: %w", table, err)
	}
	return sz, nil
}

// Pct returns the p quantile of ds (p = 1: the maximum), or 0 for none.
func Pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Ms formats d in milliseconds, to 0.1 ms.
func Ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// MiB formats n bytes in MiB.
func MiB(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }
