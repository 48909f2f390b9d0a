package otelidemq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
)

// Metric names of an outbox relay (RelayHook).
const (
	MetricSent                = "messaging.client.sent.messages"
	MetricOutboxPending       = "idemq.outbox.pending"
	MetricOutboxParked        = "idemq.outbox.parked"
	MetricOutboxOldestPending = "idemq.outbox.oldest_pending.age"
)

// RelayHook measures and traces a transactional outbox relay
// (sinks/outbox.Relay), as docs/observability.md ("Outbox relay") lists:
// pass it in the relay's outbox.Config.Hooks. Each publish of a batch is
// one "send <destination>" span of kind client, linked to the trace
// context every message was published from, counted by outcome and timed;
// the outbox's backlog is read into gauges at each collection, from the
// last relay the hook was given to: use one RelayHook per relay. It is
// safe for concurrent use.
type RelayHook struct {
	tracer                      trace.Tracer
	prop                        propagation.TextMapPropagator
	kvs                         []attribute.KeyValue // system, when set, and the operation name
	send, sent, parked, retried metric.MeasurementOption
	sentCount                   metric.Int64Counter
	duration                    metric.Float64Histogram

	mu     sync.Mutex
	counts func(ctx context.Context) (pending, parked int64, oldestPending time.Duration, err error)
}

// NewRelayHook returns a RelayHook, or an error if an instrument cannot be
// created. It uses Config's providers, Propagator and System (the
// messaging.system of every measurement and span, when set), not
// ConsumerGroup.
func NewRelayHook(cfg Config) (*RelayHook, error) {
	cfg = cfg.withDefaults()
	var system []attribute.KeyValue
	if cfg.System != "" {
		system = append(system, AttrSystem.String(cfg.System))
	}
	kvs := append(system, semconv.MessagingOperationName("send"))
	h := &RelayHook{
		tracer:  tracer(cfg.TracerProvider),
		prop:    cfg.Propagator,
		kvs:     kvs,
		send:    with(kvs),
		sent:    with(kvs, AttrOutcome.String("sent")),
		parked:  with(kvs, AttrOutcome.String("parked")),
		retried: with(kvs, AttrOutcome.String("retried")),
	}
	m := meter(cfg.MeterProvider)
	var e [5]error
	var pending, parked metric.Int64ObservableGauge
	var age metric.Float64ObservableGauge
	h.sentCount, e[0] = m.Int64Counter(MetricSent, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows the relay published, by idemq.outcome (sent, parked, retried)."))
	h.duration, e[1] = m.Float64Histogram(MetricOperationDuration, metric.WithUnit("s"),
		metric.WithDescription("Time to publish one batch of outbox rows, until the broker confirmed it."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	pending, e[2] = m.Int64ObservableGauge(MetricOutboxPending, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows waiting to be published (including rows waiting for a retry)."))
	parked, e[3] = m.Int64ObservableGauge(MetricOutboxParked, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows parked after their last allowed attempt."))
	age, e[4] = m.Float64ObservableGauge(MetricOutboxOldestPending, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest pending outbox row (0 without one)."))
	if err := errors.Join(e[:]...); err != nil {
		return nil, fmt.Errorf("otelidemq: create relay instruments: %w", err)
	}
	gauges := metric.WithAttributeSet(attribute.NewSet(system...))
	if _, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		h.mu.Lock()
		counts := h.counts
		h.mu.Unlock()
		if counts == nil {
			return nil
		}
		p, k, oldest, err := counts(ctx)
		if err != nil {
			return fmt.Errorf("otelidemq: read outbox counts: %w", err)
		}
		o.ObserveInt64(pending, p, gauges)
		o.ObserveInt64(parked, k, gauges)
		o.ObserveFloat64(age, oldest.Seconds(), gauges)
		return nil
	}, pending, parked, age); err != nil {
		return nil, fmt.Errorf("otelidemq: register relay gauges: %w", err)
	}
	return h, nil
}

// OnRelayPublish counts the batch's rows by outcome and records the
// publish's duration.
func (h *RelayHook) OnRelayPublish(ctx context.Context, rows, sent, parked int, d time.Duration, err error) {
	if sent > 0 {
		h.sentCount.Add(ctx, int64(sent), h.sent)
	}
	if parked > 0 {
		h.sentCount.Add(ctx, int64(parked), h.parked)
	}
	if retried := rows - sent - parked; retried > 0 {
		h.sentCount.Add(ctx, int64(retried), h.retried)
	}
	opt := h.send
	if err != nil {
		opt = with(h.kvs, AttrErrorType.String(errorType(err)))
	}
	h.duration.Record(ctx, d.Seconds(), opt)
}

// OnRelaySend makes the batch's send span; see RelayHook.
func (h *RelayHook) OnRelaySend(ctx context.Context, ids, destinations []string, headers []map[string]string, start time.Time, d time.Duration, err error) {
	links := make([]trace.Link, 0, len(headers))
	for _, hd := range headers {
		if len(hd) == 0 {
			continue
		}
		if sc := trace.SpanContextFromContext(h.prop.Extract(context.Background(), propagation.MapCarrier(hd))); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	attrs := make([]attribute.KeyValue, 0, len(h.kvs)+3)
	attrs = append(append(attrs, h.kvs...), semconv.MessagingOperationTypeSend)
	name := "send"
	if len(destinations) > 0 && !slices.ContainsFunc(destinations[1:], func(s string) bool { return s != destinations[0] }) {
		name += " " + destinations[0]
		attrs = append(attrs, semconv.MessagingDestinationName(destinations[0]))
	}
	if len(ids) == 1 {
		attrs = append(attrs, semconv.MessagingMessageID(ids[0]))
	} else {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(ids)))
	}
	timedSpan(ctx, h.tracer, name, start, start.Add(d), err,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...), trace.WithAttributes(attrs...))
}

// ObserveRelayCounts keeps counts for the gauges; the last call wins.
func (h *RelayHook) ObserveRelayCounts(counts func(ctx context.Context) (pending, parked int64, oldestPending time.Duration, err error)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts = counts
}
