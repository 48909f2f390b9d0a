package otelidemq_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// sdkHook returns a Hook on a real SDK: every span sampled and batched to
// a no-op exporter, metrics aggregated for a reader; with perTx, a span per
// transaction.
func sdkHook(b *testing.B, perTx bool) consumer.Hook {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	h, err := otelidemq.New(otelidemq.Config{TracerProvider: tp, MeterProvider: mp, ConsumerGroup: "bench", SpanPerTransaction: perTx})
	if err != nil {
		b.Fatal(err)
	}
	return h
}

// runBench publishes b.N messages to memsource and times a runner (batch
// 100, one lane) handling them all.
func runBench(b *testing.B, path consumer.Path, hooks []consumer.Hook) {
	br := memBroker(b, memsource.Config{})
	r, err := consumer.NewRunner(br.Source("t"), path, consumer.Config{Name: "bench", Concurrency: 1, BatchSize: 100, Hooks: hooks})
	if err != nil {
		b.Fatal(err)
	}
	msgs := make([]memsource.Outgoing, b.N)
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	for i := range msgs {
		msgs[i] = memsource.Outgoing{Key: prefix + strconv.Itoa(i), Body: []byte(`{"amount":1}`)}
	}
	br.Publish("t", msgs...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for r.Stats().Handled < uint64(b.N) {
		time.Sleep(200 * time.Microsecond)
	}
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatalf("Run: %v", err)
	}
}

// BenchmarkOverhead measures the transactional path at batch 100 with no
// hooks and with otelidemq on the OpenTelemetry SDK, over memdedup (the
// framework alone; per-message handler and batch API) and over PostgreSQL
// (a handler inserting one row).
func BenchmarkOverhead(b *testing.B) {
	hooks := map[string]func(*testing.B) []consumer.Hook{
		"none":       func(*testing.B) []consumer.Hook { return nil },
		"otel":       func(b *testing.B) []consumer.Hook { return []consumer.Hook{sdkHook(b, false)} },
		"otel-pertx": func(b *testing.B) []consumer.Hook { return []consumer.Hook{sdkHook(b, true)} },
	}
	for _, h := range []string{"none", "otel"} {
		b.Run("memdedup/"+h, func(b *testing.B) {
			store, err := memdedup.New(memdedup.Config{})
			if err != nil {
				b.Fatal(err)
			}
			runBench(b, consumer.Transactional(store, succeed), hooks[h](b))
		})
	}
	for _, h := range []string{"none", "otel", "otel-pertx"} {
		b.Run("memdedup-batch-api/"+h, func(b *testing.B) {
			store, err := memdedup.New(memdedup.Config{})
			if err != nil {
				b.Fatal(err)
			}
			runBench(b, consumer.TransactionalBatch(store, func(context.Context, *memdedup.Tx, []*consumer.Message) error { return nil }), hooks[h](b))
		})
	}
	if testing.Short() {
		return
	}
	url := testenv.DatabaseURL(b)
	schema := testenv.Schema(b, url)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	table := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (key text PRIMARY KEY, body text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (key, body) VALUES ($1, $2)`, m.Key, string(m.Body))
		return err
	}
	for _, h := range []string{"none", "otel"} {
		b.Run("postgres/"+h, func(b *testing.B) {
			runBench(b, consumer.Transactional(store, handler), hooks[h](b))
		})
	}
}

// BenchmarkHook measures the hook alone, per message, on the SDK: the
// events a TransactionalBatch runner sends for a batch of 100 new messages
// (receipt, batch, the transaction, settlement), with a span per message
// and with SpanPerTransaction.
func BenchmarkHook(b *testing.B) {
	for _, perTx := range []bool{false, true} {
		name := map[bool]string{false: "span-per-message", true: "span-per-transaction"}[perTx]
		b.Run(name, func(b *testing.B) {
			h := sdkHook(b, perTx).(*otelidemq.Hook)
			const batch = 100
			msgs := make([]*consumer.Message, batch)
			for i := range msgs {
				msgs[i] = &consumer.Message{ID: strconv.Itoa(i), Key: strconv.Itoa(i), Topic: "orders", Attempt: 1}
			}
			ctxs := make([]context.Context, batch)
			ctx := context.Background()
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				i := n % batch
				ctxs[i] = h.OnReceived(ctx, msgs[i])
				if n++; i < batch-1 {
					continue
				}
				h.OnBatch(ctx, batch)
				now := time.Now()
				h.OnTx(ctx, consumer.TxInfo{Claimed: ctxs, New: ctxs, ClaimStart: now, ClaimEnd: now,
					HandlerStart: now, HandlerEnd: now, Commit: consumer.CommitInfo{Start: now, End: now, Messages: batch}})
				for j, c := range ctxs {
					h.OnSettled(c, msgs[j], consumer.SettleInfo{Outcome: consumer.OutcomeHandled, BatchSize: batch})
				}
			}
		})
	}
}
