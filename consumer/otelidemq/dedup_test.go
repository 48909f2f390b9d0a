package otelidemq_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// floatGauge returns the value of the float64 gauge name whose scope
// attribute is scope, and whether there is one.
func floatGauge(rm metricdata.ResourceMetrics, name, scope string) (float64, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			g, ok := m.Data.(metricdata.Gauge[float64])
			if m.Name != name || !ok {
				continue
			}
			for _, p := range g.DataPoints {
				if v, ok := p.Attributes.Value(otelidemq.AttrScope); ok && v.AsString() == scope {
					return p.Value, true
				}
			}
		}
	}
	return 0, false
}

// The dedup table's records per scope and oldest record's age, measured by
// the janitor on the real PostgreSQL, are exported as gauges.
func TestDedupTableGauges(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped with -short")
	}
	url := testenv.DatabaseURL(t)
	ctx := brokerCtx(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: testenv.Schema(t, url), CleanupInterval: 20 * time.Millisecond, StatsInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tel := newTelemetry(t, otelidemq.Config{})
	reg, err := tel.hook.ObserveDedup(store)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := reg.Unregister(); err != nil {
			t.Errorf("Unregister: %v", err)
		}
	}()
	if _, ok := gauge(tel.metrics(t), otelidemq.MetricDedupRecords); ok {
		t.Fatal("records observed before the janitor measured the table")
	}

	for scope, keys := range map[string][]string{"orders": {"o1", "o2", "o3"}, "emails": {"e1"}} {
		tx, err := store.Driver().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer store.Driver().Rollback(ctx, tx) // released if the test fails first; a no-op after Commit
		var recs []dedup.Record
		for _, k := range keys {
			recs = append(recs, dedup.Record{Key: k, PayloadHash: dedup.HashPayload([]byte(k))})
		}
		if _, err := store.Driver().Claim(ctx, tx, scope, recs); err != nil {
			t.Fatal(err)
		}
		if err := store.Driver().Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	table := pgx.Identifier{store.Config().Schema, "processed_messages"}.Sanitize()
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET processed_at = now() - interval '1 hour' WHERE key = 'o2'`); err != nil {
		t.Fatal(err)
	}
	jctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- store.RunJanitor(jctx) }()
	for {
		if _, ok := store.TableStats(); ok {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the janitor reported no measurement in time")
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	rm := tel.metrics(t)
	for scope, want := range map[string]int64{"orders": 3, "emails": 1} {
		if n, ok := gauge(rm, otelidemq.MetricDedupRecords, otelidemq.AttrScope.String(scope)); !ok || n != want {
			t.Errorf("%s{scope=%s} = %d (present %v), want %d", otelidemq.MetricDedupRecords, scope, n, ok, want)
		}
	}
	if age, ok := floatGauge(rm, otelidemq.MetricDedupOldestAge, "orders"); !ok || age < 3600 || age > 3600+60 {
		t.Errorf("%s{scope=orders} = %.1f s (present %v), want about 3600", otelidemq.MetricDedupOldestAge, age, ok)
	}
	if age, ok := floatGauge(rm, otelidemq.MetricDedupOldestAge, "emails"); !ok || age > 60 {
		t.Errorf("%s{scope=emails} = %.1f s (present %v), want under a minute", otelidemq.MetricDedupOldestAge, age, ok)
	}
}
