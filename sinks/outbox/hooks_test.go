package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/sinks/outbox"
)

var (
	_ outbox.HookPublish = (*otelidemq.RelayHook)(nil)
	_ outbox.HookCounts  = (*otelidemq.RelayHook)(nil)
)

// relayMetrics is what one collection of a RelayHook's instruments read.
type relayMetrics struct {
	pending, parked int64
	oldest          float64
	sent            map[string]int64 // by idemq.outcome
	publishes       uint64           // publish calls measured
	failedPublishes uint64           // of which with an error.type
}

func collectRelay(t *testing.T, reader *sdkmetric.ManualReader) relayMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := relayMetrics{sent: map[string]int64{}}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					switch m.Name {
					case otelidemq.MetricOutboxPending:
						got.pending = p.Value
					case otelidemq.MetricOutboxParked:
						got.parked = p.Value
					}
				}
			case metricdata.Gauge[float64]:
				if m.Name == otelidemq.MetricOutboxOldestPending {
					for _, p := range d.DataPoints {
						got.oldest = p.Value
					}
				}
			case metricdata.Sum[int64]:
				if m.Name == otelidemq.MetricSent {
					for _, p := range d.DataPoints {
						o, _ := p.Attributes.Value(otelidemq.AttrOutcome)
						got.sent[o.AsString()] += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name == otelidemq.MetricOperationDuration {
					for _, p := range d.DataPoints {
						got.publishes += p.Count
						if _, ok := p.Attributes.Value(otelidemq.AttrErrorType); ok {
							got.failedPublishes += p.Count
						}
						if op, _ := p.Attributes.Value(otelidemq.AttrOperationName); op != attribute.StringValue("send") {
							t.Errorf("publish duration with messaging.operation.name %q, want send", op.AsString())
						}
					}
				}
			}
		}
	}
	return got
}

// A relay with otelidemq's RelayHook reports the rows pending and parked,
// the age of the oldest pending row, the rows it published by outcome, and
// how long each publish took.
func TestRelayMetrics(t *testing.T) {
	ctx := context.Background()
	db := newSQLite(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []outbox.Message{
		{ID: "a1", Destination: "d", Key: "a"},
		{ID: "p1", Destination: "missing", Key: "p"},
		{ID: "b1", Destination: "d", Key: "b"},
	} {
		if _, err := outbox.PublishSQL(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	hook, err := otelidemq.NewRelayHook(otelidemq.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	pub := &recorder{fail: func(m outbox.Message) error {
		if m.Destination == "missing" {
			return outbox.NoDestination(errors.New("no such topic"))
		}
		return nil
	}}
	cfg := testConfig() // MaxAttempts 3
	cfg.Hooks = []outbox.Hook{hook}
	r, err := outbox.NewSQLiteRelay(db, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}

	time.Sleep(5 * time.Millisecond) // so that the oldest row has an age
	before := collectRelay(t, reader)
	if before.pending != 3 || before.parked != 0 || before.oldest <= 0 || before.publishes != 0 {
		t.Fatalf("before the relay ran: %+v, want 3 pending, 0 parked, an age, no publish", before)
	}

	relayUntil(t, r, func(c outbox.Counts) bool { return c.Sent == 2 && c.Parked == 1 })

	after := collectRelay(t, reader)
	if after.pending != 0 || after.parked != 1 || after.oldest != 0 {
		t.Fatalf("after: pending %d, parked %d, oldest %v s; want 0, 1, 0", after.pending, after.parked, after.oldest)
	}
	if after.sent["sent"] != 2 || after.sent["parked"] != 1 || after.sent["retried"] != 2 {
		t.Fatalf("rows by outcome %v, want 2 sent, 1 parked, 2 retried (p1's first two attempts)", after.sent)
	}
	// The first batch sends a1 and b1 and fails p1; two more batches fail
	// p1, the last of them parks it.
	if after.publishes != 3 || after.failedPublishes != 3 {
		t.Fatalf("%d publishes measured, %d with an error.type; want 3 and 3", after.publishes, after.failedPublishes)
	}
}

// A message published by a traced handler reaches the broker with the
// handler span's W3C trace context in its headers, and the downstream
// consumer's span (otelidemq.Extract) continues that trace.
func TestRelayCarriesTraceContext(t *testing.T) {
	ctx := context.Background()
	db := newSQLite(t)
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(ctx, "handler")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.PublishSQL(ctx, tx, outbox.Message{ID: "e1", Destination: "d", Key: "k", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	span.End()

	pub := &recorder{}
	r, err := outbox.NewSQLiteRelay(db, pub, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	drain(t, r)
	if len(pub.got) != 1 {
		t.Fatalf("published %d messages, want 1", len(pub.got))
	}
	sent := pub.got[0]
	if sent.Headers["traceparent"] == "" {
		t.Fatalf("published headers %v carry no traceparent", sent.Headers)
	}
	down := otelidemq.Extract(context.Background(), propagation.TraceContext{}, &consumer.Message{Key: sent.ID, Headers: sent.Headers})
	got := trace.SpanContextFromContext(down)
	want := span.SpanContext()
	if got.TraceID() != want.TraceID() || got.SpanID() != want.SpanID() || !got.IsRemote() {
		t.Fatalf("downstream parent %s/%s, want the handler span %s/%s", got.TraceID(), got.SpanID(), want.TraceID(), want.SpanID())
	}
}

// The relay's publish of a batch is a "send" span (kind client: the stored
// trace context, not the send span, is the messages' creation context)
// linked to each message's stored trace context, with the messaging
// conventions' send attributes.
func TestRelaySendSpan(t *testing.T) {
	ctx := context.Background()
	db := newSQLite(t)
	tp := sdktrace.NewTracerProvider()
	var handlers []trace.SpanContext
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"e1", "e2"} {
		hctx, span := tp.Tracer("test").Start(ctx, "handler")
		if _, err := outbox.PublishSQL(hctx, tx, outbox.Message{ID: id, Destination: "orders", Key: id, Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		span.End()
		handlers = append(handlers, span.SpanContext())
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	spans := tracetest.NewSpanRecorder()
	rtp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = rtp.Shutdown(context.Background()) })
	hook, err := otelidemq.NewRelayHook(otelidemq.Config{TracerProvider: rtp, System: "kafka"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Hooks = []outbox.Hook{hook}
	r, err := outbox.NewSQLiteRelay(db, &recorder{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	drain(t, r)

	var send []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "send orders" {
			send = append(send, s)
		}
	}
	if len(send) != 1 {
		t.Fatalf("%d \"send orders\" spans (all: %d), want 1 for the batch", len(send), len(spans.Ended()))
	}
	s := send[0]
	if s.SpanKind() != trace.SpanKindClient {
		t.Errorf("send span kind %v, want client", s.SpanKind())
	}
	linked := map[trace.SpanID]bool{}
	for _, l := range s.Links() {
		linked[l.SpanContext.SpanID()] = l.SpanContext.TraceID().IsValid()
	}
	for _, h := range handlers {
		if !linked[h.SpanID()] {
			t.Errorf("send span links %v, want one to stored context %s", s.Links(), h.SpanID())
		}
	}
	want := map[attribute.Key]attribute.Value{
		semconv.MessagingSystemKey:            attribute.StringValue("kafka"),
		semconv.MessagingOperationNameKey:     attribute.StringValue("send"),
		semconv.MessagingOperationTypeKey:     attribute.StringValue("send"),
		semconv.MessagingDestinationNameKey:   attribute.StringValue("orders"),
		semconv.MessagingBatchMessageCountKey: attribute.IntValue(2),
	}
	got := map[attribute.Key]attribute.Value{}
	for _, a := range s.Attributes() {
		got[a.Key] = a.Value
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("send span %s = %q, want %q", k, got[k].String(), v.String())
		}
	}
}
