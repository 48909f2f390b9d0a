package otelidemq_test

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/consumer/otelidemq"
)

// attrSets returns the attribute sets of the data points of metric name.
func attrSets(rm metricdata.ResourceMetrics, name string) []attribute.Set {
	var out []attribute.Set
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out = append(out, p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out = append(out, p.Attributes)
				}
			}
		}
	}
	return out
}

// The hook copies what a source says of its broker, whatever the broker:
// the destination's attributes on the process span, those the messaging
// conventions put on metrics on the metrics too, the message's own at its
// settlement, the source's destination name and name of an
// acknowledgement, with Config.ConsumerGroup in place of the source's
// group.
func TestBrokerAttributesCopied(t *testing.T) {
	broker := consumer.BrokerInfo{
		System: "pulsar", ServerAddress: "10.0.0.1", ServerPort: 6650, SettleName: "acknowledge",
		Attrs: []consumer.BrokerAttr{
			consumer.StringAttr("messaging.consumer.group.name", "source-group"),
			consumer.StringAttr("messaging.destination.partition.id", "5"),
			consumer.StringAttr("messaging.destination.name", "persistent://t/ns/orders"),
			consumer.StringAttr("example.tenant", "t"),
			consumer.IntAttr("example.shard", 2), // past the ones a cache key holds as they are
		},
		MessageAttrs: []consumer.BrokerAttr{consumer.IntAttr("example.sequence", 9)},
	}
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: "config-group"})
	store := memStore(t)
	b := memBroker(t, memsource.Config{})
	b.Publish("orders", memsource.Outgoing{Key: "k1"}, memsource.Outgoing{Key: "k2"})
	r := tel.runner(t, brokerSource{b.Source("orders"), broker}, consumer.Transactional(store, succeed), consumer.Config{})
	runIdle(t, r)

	onSpan := []attribute.KeyValue{
		semconv.MessagingSystemKey.String("pulsar"), semconv.ServerAddress("10.0.0.1"), semconv.ServerPort(6650),
		semconv.MessagingConsumerGroupName("config-group"), semconv.MessagingDestinationPartitionID("5"),
		semconv.MessagingDestinationName("persistent://t/ns/orders"),
		attribute.String("example.tenant", "t"), attribute.Int64("example.shard", 2), attribute.Int64("example.sequence", 9),
	}
	var n int
	for _, s := range tel.spans.Ended() {
		if s.Name() != "process persistent://t/ns/orders" {
			continue
		}
		n++
		for _, kv := range onSpan {
			if got, ok := attr(s, kv.Key); !ok || got != kv.Value {
				t.Errorf("span attribute %s = %s (present %v), want %s", kv.Key, got.String(), ok, kv.Value.String())
			}
		}
	}
	if n != 2 {
		t.Fatalf("%d process spans named for the source's destination, want 2", n)
	}

	rm := tel.metrics(t)
	consumed := attrSets(rm, otelidemq.MetricConsumed)
	if len(consumed) != 1 {
		t.Fatalf("%s points %v, want 1", otelidemq.MetricConsumed, consumed)
	}
	for _, kv := range onSpan[:6] {
		if got, ok := consumed[0].Value(kv.Key); !ok || got != kv.Value {
			t.Errorf("%s attribute %s = %s (present %v), want %s", otelidemq.MetricConsumed, kv.Key, got.String(), ok, kv.Value.String())
		}
	}
	for _, k := range []attribute.Key{"example.tenant", "example.shard", "example.sequence"} {
		if v, ok := consumed[0].Value(k); ok {
			t.Errorf("%s has the span-only attribute %s = %s", otelidemq.MetricConsumed, k, v.String())
		}
	}
	settles := attrSets(rm, otelidemq.MetricOperationDuration)
	if len(settles) == 0 {
		t.Fatalf("no %s points", otelidemq.MetricOperationDuration)
	}
	for _, set := range settles {
		if v, _ := set.Value(semconv.MessagingOperationNameKey); v.AsString() != "acknowledge" {
			t.Errorf("%s %s = %q, want the source's %q", otelidemq.MetricOperationDuration, semconv.MessagingOperationNameKey, v.AsString(), "acknowledge")
		}
	}
}
