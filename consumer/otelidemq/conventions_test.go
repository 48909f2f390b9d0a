package otelidemq_test

import (
	"slices"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/consumer/otelidemq"
)

// The metrics follow the messaging conventions: a versioned scope with the
// semconv schema URL, the advised buckets, messaging.operation.type on the
// process metrics and idemq.batch.size, and a consumer-side
// messaging.client.operation.duration for acknowledgements.
func TestMetricConventions(t *testing.T) {
	tel := newTelemetry(t, otelidemq.Config{})
	store := memStore(t)
	b := memBroker(t, memsource.Config{})
	b.Publish("orders", memsource.Outgoing{Key: "k1"}, memsource.Outgoing{Key: "k2"})
	r := tel.runner(t, b.Source("orders"), consumer.Transactional(store, succeed), consumer.Config{})
	runIdle(t, r)

	rm := tel.metrics(t)
	advised := []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	seen := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Version == "" || sm.Scope.SchemaURL != semconv.SchemaURL {
			t.Errorf("scope %q version %q schema %q, want a version and %q", sm.Scope.Name, sm.Scope.Version, sm.Scope.SchemaURL, semconv.SchemaURL)
		}
		for _, m := range sm.Metrics {
			seen[m.Name] = true
			switch m.Name {
			case "messaging.process.duration", "messaging.client.operation.duration":
				h, ok := m.Data.(metricdata.Histogram[float64])
				if !ok || len(h.DataPoints) == 0 {
					t.Errorf("%s: no histogram points", m.Name)
					continue
				}
				p := h.DataPoints[0]
				if !slices.Equal(p.Bounds, advised) {
					t.Errorf("%s buckets %v, want the advised %v", m.Name, p.Bounds, advised)
				}
				want := "process"
				if m.Name == "messaging.client.operation.duration" {
					want = "settle"
				}
				if v, _ := p.Attributes.Value(semconv.MessagingOperationTypeKey); v.AsString() != want {
					t.Errorf("%s: %s %q, want %q", m.Name, semconv.MessagingOperationTypeKey, v.AsString(), want)
				}
				if v, _ := p.Attributes.Value(semconv.MessagingSystemKey); v.AsString() == "" {
					t.Errorf("%s: no %s", m.Name, semconv.MessagingSystemKey)
				}
			case otelidemq.MetricBatchSize:
				h, ok := m.Data.(metricdata.Histogram[int64])
				if !ok || len(h.DataPoints) == 0 {
					t.Errorf("%s: no histogram points", m.Name)
					continue
				}
				if v, _ := h.DataPoints[0].Attributes.Value(semconv.MessagingOperationTypeKey); v.AsString() != "process" {
					t.Errorf("%s attributes %v, want %s process", m.Name, h.DataPoints[0].Attributes.ToSlice(), semconv.MessagingOperationTypeKey)
				}
			}
		}
	}
	for _, name := range []string{"messaging.process.duration", "messaging.client.operation.duration", otelidemq.MetricBatchSize} {
		if !seen[name] {
			t.Errorf("no %s metric", name)
		}
	}
}

// Where the source says its broker does not mark every redelivery (Kafka),
// a first delivery of a processed key may be a producer's re-send or a
// message fetched again after a rebalance: the duplicate reason is
// "unknown", not the runner's guess "producer". Elsewhere it stays
// "producer".
func TestUnmarkedRedeliveryDuplicateReasonUnknown(t *testing.T) {
	for _, c := range []struct {
		name   string
		broker consumer.BrokerInfo
		want   string
	}{
		{"unmarked", consumer.BrokerInfo{System: "kafka", UnmarkedRedeliveries: true}, "unknown"},
		{"marked", consumer.BrokerInfo{System: "rabbitmq"}, "producer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tel := newTelemetry(t, otelidemq.Config{})
			store := memStore(t)
			b := memBroker(t, memsource.Config{})
			b.Publish("orders", memsource.Outgoing{Key: "k1"})
			r := tel.runner(t, brokerSource{b.Source("orders"), c.broker}, consumer.Transactional(store, succeed), consumer.Config{})
			runIdle(t, r, func() { b.Publish("orders", memsource.Outgoing{Key: "k1"}) })
			if st := r.Stats(); st.Duplicates != 1 {
				t.Fatalf("stats %+v, want 1 duplicate", st)
			}
			rm := tel.metrics(t)
			if n := sum(rm, otelidemq.MetricDuplicates, otelidemq.AttrDuplicateReason, c.want); n != 1 {
				t.Errorf("%s with reason %q: %d, want 1", otelidemq.MetricDuplicates, c.want, n)
			}
		})
	}
}
