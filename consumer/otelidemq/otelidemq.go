package otelidemq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"go.opentelemetry.io/otel/semconv/v1.41.0/messagingconv"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
)

// ScopeName is the instrumentation scope of the tracer and the meter. The
// scope's version is the idemq module's version in the binary's build
// information ("devel" without one), and its schema URL is SchemaURL.
const ScopeName = "github.com/idemq/idemq/consumer/otelidemq"

// SchemaURL is the version of the OpenTelemetry semantic conventions the
// spans and metrics follow: go.opentelemetry.io/otel/semconv/v1.41.0.
const SchemaURL = semconv.SchemaURL

// modulePath is the module whose version the instrumentation scope carries.
const modulePath = "github.com/idemq/idemq"

// scopeVersion is the instrumentation scope's version; see ScopeName.
var scopeVersion = func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if bi.Main.Path == modulePath && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == modulePath && d.Version != "" {
			return d.Version
		}
	}
	return "devel"
}()

// Attribute keys: the OpenTelemetry messaging semantic conventions, taken
// from the official semconv package so that they cannot drift, and
// idemq's own (idemq.*).
const (
	AttrSystem        = semconv.MessagingSystemKey
	AttrDestination   = semconv.MessagingDestinationNameKey
	AttrConsumerGroup = semconv.MessagingConsumerGroupNameKey
	AttrMessageID     = semconv.MessagingMessageIDKey
	AttrOperationType = semconv.MessagingOperationTypeKey
	AttrOperationName = semconv.MessagingOperationNameKey
	// AttrBatchCount is set on spans covering more than one message only.
	AttrBatchCount = semconv.MessagingBatchMessageCountKey
	AttrBatchNew   = attribute.Key("idemq.batch.new_count") // messages claimed as new (SpanPerTransaction)
	// AttrAttempt is the broker's delivery count (consumer.Message.Attempt,
	// from 1). The conventions register no delivery count for most
	// brokers, hence an idemq name.
	AttrAttempt         = attribute.Key("idemq.message.attempt")
	AttrErrorType       = semconv.ErrorTypeKey
	AttrServerAddress   = semconv.ServerAddressKey
	AttrServerPort      = semconv.ServerPortKey
	AttrOutcome         = attribute.Key("idemq.outcome")
	AttrDuplicateReason = attribute.Key("idemq.duplicate.reason")
	AttrDeadLetter      = attribute.Key("idemq.dead_letter.reason")
	AttrRetryKind       = attribute.Key("idemq.retry.kind")
	AttrClaim           = attribute.Key("idemq.claim")
	AttrPartition       = semconv.MessagingDestinationPartitionIDKey
	AttrScope           = attribute.Key("idemq.dedup.scope")
)

// DuplicateUnknown is the duplicate reason ("unknown") reported in place
// of consumer.DuplicateProducer for a message whose broker does not mark
// every redelivery (consumer.BrokerInfo.UnmarkedRedeliveries: kafkasource),
// where the runner cannot tell a redelivery from a producer's re-send.
const DuplicateUnknown consumer.DuplicateReason = 0

// Span event names.
const (
	EventDuplicate  = "idemq.duplicate"
	EventRetry      = "idemq.retry"
	EventDeadLetter = "idemq.dead_letter"
	EventLeaseLost  = "idemq.lease_lost"
)

// systemUnknown is messaging.system when neither Config.System nor the
// message's source names one.
const systemUnknown = "idemq"

// Config configures a Hook. The zero value uses the global providers.
type Config struct {
	// TracerProvider makes the spans. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator extracts the producer's context from Message.Headers.
	// Defaults to otel.GetTextMapPropagator(), or, while that is the
	// no-op default, W3C trace context and baggage.
	Propagator propagation.TextMapPropagator
	// System is messaging.system. Defaults to the message's
	// Broker.System, else "idemq".
	System string
	// ConsumerGroup is messaging.consumer.group.name. It replaces the
	// group a message's source reports (kafkasource reports its GroupID),
	// is set on the messages of a source that names no system
	// (Broker.System empty, as memsource) and on the measurements made
	// without a message, and is left out for the messages of every other
	// source (SQS and RabbitMQ have no consumer groups). Defaults to the
	// group the source reports.
	ConsumerGroup string
	// ParentOnProducer makes a message's process span a child of the
	// producer's span found in its headers, as well as linked to it: one
	// trace tree from producer to consumer, at the cost of traces that
	// never end for long-lived producers. Defaults to false: the process
	// span is a root span linked to the producer's.
	ParentOnProducer bool
	// SpanPerTransaction makes one "process <destination>" span per
	// transaction of the transactional path instead of one per message
	// (see "Span per transaction" in the package documentation), for
	// TransactionalBatch at large batches. Metrics are the same in both
	// modes. Defaults to false: a span per message.
	SpanPerTransaction bool
}

// Hook is a consumer.Hook that traces every message with OpenTelemetry and
// records metrics, as the package documentation describes (Traces, Span
// per transaction, Metrics). Pass it in consumer.Config.Hooks. It is safe
// for concurrent use; one Hook may serve several runners.
type Hook struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	system string
	group  string
	parent bool // Config.ParentOnProducer
	perTx  bool // Config.SpanPerTransaction
	// noDest holds the options of a measurement made without a message:
	// Config.System and Config.ConsumerGroup when set, but one with
	// attributes of its own (a reason, an error) carries those alone.
	noDest *destAttrs
	// Span options built once.
	kindOpt   trace.SpanStartOption
	claimOpts [dedup.StateDone + 1]trace.SpanStartOption

	consumed, duplicates, deadLetters, retries, ackFailures metric.Int64Counter
	leaseRefreshFail, leaseLost                             metric.Int64Counter
	inFlight                                                metric.Int64UpDownCounter
	processDur, handlerDur, commitDur, clientDur            metric.Float64Histogram
	batchSize                                               metric.Int64Histogram

	// Observed on demand (ObserveLag, ...).
	meter        metric.Meter
	lag          metric.Int64ObservableGauge
	dedupRecords metric.Int64ObservableGauge
	dedupOldest  metric.Float64ObservableGauge

	mu       sync.RWMutex
	dests    map[destKey]*destAttrs
	lastDest atomic.Pointer[destAttrs] // the latest destination looked up
}

// maxKeyAttrs is the number of a destination's attributes a destKey holds
// as they are; the rest it holds as text.
const maxKeyAttrs = 4

// destKey names the metric attributes of one destination: the message's
// system and topic, and what its BrokerInfo says of where it came from
// (but for the attributes of the message alone).
type destKey struct {
	system, topic, settle string
	server                string
	port                  int
	// group is Config.ConsumerGroup where it applies to the message (see
	// Config.ConsumerGroup), else empty.
	group string
	// dest is the source's messaging.destination.name, else empty.
	dest  string
	attrs [maxKeyAttrs]consumer.BrokerAttr // zero past len(Attrs)
	more  string                           // the attributes past maxKeyAttrs, as text
}

// keyOf returns the destKey of m for system.
func (h *Hook) keyOf(system string, m *consumer.Message) destKey {
	b := &m.Broker
	k := destKey{system: system, topic: m.Topic, settle: b.SettleName, server: b.ServerAddress, port: b.ServerPort}
	hasGroup := false
	for i, a := range b.Attrs {
		switch a.Key {
		case string(semconv.MessagingDestinationNameKey):
			k.dest = a.Value()
		case string(AttrConsumerGroup):
			hasGroup = true
		}
		if i < maxKeyAttrs {
			k.attrs[i] = a
			continue
		}
		if _, isInt := a.Int(); isInt {
			k.more += "\x00#"
		} else {
			k.more += "\x00"
		}
		k.more += a.Key + "\x00" + a.Value()
	}
	if h.group != "" && (hasGroup || b.System == "") {
		k.group = h.group
	}
	return k
}

// kv returns a as an OpenTelemetry attribute.
func kv(a consumer.BrokerAttr) attribute.KeyValue {
	if n, ok := a.Int(); ok {
		return attribute.Int64(a.Key, n)
	}
	return attribute.String(a.Key, a.Value())
}

// metricKeys are the keys of the destination attributes that the
// messaging conventions put on the metrics too, but for the consumer
// group, which every measurement of the destination carries; the others
// are set on spans only.
var metricKeys = map[attribute.Key]bool{
	semconv.MessagingDestinationPartitionIDKey:      true,
	semconv.MessagingDestinationSubscriptionNameKey: true,
	semconv.MessagingDestinationTemplateKey:         true,
}

// destAttrs are the metric attributes of one destination, built once: an
// attribute set per measurement would cost more than the measurement.
type destAttrs struct {
	key      destKey
	spanName string                // "process <destination>"
	kvs      []attribute.KeyValue  // the metric attributes
	spanKVs  []attribute.KeyValue  // kvs and those of spans only
	spanOpt  trace.SpanStartOption // a process span's start attributes: spanKVs
	// batch is the option of idemq.batch.size: kvs without the
	// destination and partition, which a lane's batch may mix.
	batch []metric.RecordOption
	// settle and settleAny are the options of an acknowledgement's
	// messaging.client.operation.duration, with and without the
	// destination.
	settle, settleAny []metric.RecordOption
	// The measurement options, as the variadic slices the instruments
	// take: the destination's attributes, and with an outcome, a duplicate
	// reason or a retry kind.
	add      []metric.AddOption
	rec      []metric.RecordOption
	outcomes [consumer.OutcomeLeft + 1][]metric.RecordOption
	dups     [consumer.DuplicateProducer + 1][]metric.AddOption
	retries  [consumer.RetryInfrastructure + 1][]metric.AddOption
}

// with returns the measurement option of kvs and extra.
func with(kvs []attribute.KeyValue, extra ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(append(kvs[:len(kvs):len(kvs)], extra...)...))
}

// newDest returns the destAttrs of the metric attributes kvs, whose
// measurements without attributes of their own take opt.
func newDest(kvs []attribute.KeyValue, opt metric.MeasurementOption) *destAttrs {
	d := &destAttrs{kvs: kvs, add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}}
	for o := range d.outcomes {
		d.outcomes[o] = []metric.RecordOption{with(kvs, AttrOutcome.String(consumer.Outcome(o).String()))}
	}
	for r := range d.dups {
		d.dups[r] = []metric.AddOption{with(kvs, AttrDuplicateReason.String(consumer.DuplicateReason(r).String()))}
	}
	for k := range d.retries {
		d.retries[k] = []metric.AddOption{with(kvs, AttrRetryKind.String(consumer.RetryKind(k).String()))}
	}
	return d
}

// addWith returns the counter options of d's attributes and extra.
func (d *destAttrs) addWith(extra ...attribute.KeyValue) []metric.AddOption {
	if len(extra) == 0 {
		return d.add
	}
	return []metric.AddOption{with(d.kvs, extra...)}
}

// recWith is addWith for histograms.
func (d *destAttrs) recWith(extra ...attribute.KeyValue) []metric.RecordOption {
	if len(extra) == 0 {
		return d.rec
	}
	return []metric.RecordOption{with(d.kvs, extra...)}
}

// attrsOf returns the metric attributes of a destination: k, made of b.
func (h *Hook) attrsOf(k destKey, b *consumer.BrokerInfo) *destAttrs {
	if d := h.lastDest.Load(); d != nil && d.key == k {
		return d
	}
	h.mu.RLock()
	d := h.dests[k]
	h.mu.RUnlock()
	if d != nil {
		h.lastDest.Store(d)
		return d
	}
	destination := cmp.Or(k.dest, k.topic) // the source's name, else the topic or queue
	// group and server: the attributes of every measurement of the
	// destination but for its name and partition.
	var where, dest, spanOnly []attribute.KeyValue
	if k.group != "" {
		where = append(where, semconv.MessagingConsumerGroupName(k.group))
	}
	for _, a := range b.Attrs {
		switch key := attribute.Key(a.Key); {
		case a.Key == "" || key == semconv.MessagingDestinationNameKey:
		case key == AttrConsumerGroup:
			if k.group == "" {
				where = append(where, kv(a))
			}
		case metricKeys[key]:
			dest = append(dest, kv(a))
		default:
			spanOnly = append(spanOnly, kv(a))
		}
	}
	if k.server != "" {
		where = append(where, semconv.ServerAddress(k.server))
		if k.port > 0 {
			where = append(where, semconv.ServerPort(k.port))
		}
	}
	common := append([]attribute.KeyValue{AttrSystem.String(k.system), semconv.MessagingOperationName("process"), semconv.MessagingOperationTypeProcess}, where...)
	kvs := append(common[:len(common):len(common)], semconv.MessagingDestinationName(destination))
	kvs = append(kvs, dest...)
	spanKVs := append(kvs[:len(kvs):len(kvs)], spanOnly...)
	d = newDest(kvs, with(kvs))
	d.key, d.spanName, d.spanKVs = k, "process "+destination, spanKVs
	d.spanOpt = trace.WithAttributes(spanKVs...)
	d.batch = []metric.RecordOption{with(common)}
	settle := []attribute.KeyValue{AttrSystem.String(k.system), semconv.MessagingOperationName(cmp.Or(k.settle, "ack")), semconv.MessagingOperationTypeSettle}
	settle = append(settle, where...)
	d.settleAny = []metric.RecordOption{with(settle)}
	d.settle = []metric.RecordOption{with(settle, semconv.MessagingDestinationName(destination))}
	h.lastDest.Store(d)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.dests) < maxDestinations {
		h.dests[k] = d
	}
	return d
}

// maxDestinations bounds the cache of destination attributes.
const maxDestinations = 1000

var (
	_ consumer.HookReceived           = (*Hook)(nil)
	_ consumer.HookBatch              = (*Hook)(nil)
	_ consumer.HookClaimed            = (*Hook)(nil)
	_ consumer.HookHandlerStart       = (*Hook)(nil)
	_ consumer.HookHandlerEnd         = (*Hook)(nil)
	_ consumer.HookCommit             = (*Hook)(nil)
	_ consumer.HookTx                 = (*Hook)(nil)
	_ consumer.HookAck                = (*Hook)(nil)
	_ consumer.HookRetry              = (*Hook)(nil)
	_ consumer.HookDeadLetter         = (*Hook)(nil)
	_ consumer.HookLeaseLost          = (*Hook)(nil)
	_ consumer.HookLeaseRefreshFailed = (*Hook)(nil)
	_ consumer.HookSettled            = (*Hook)(nil)
)

// New returns a Hook, or an error if an instrument cannot be created.
func New(cfg Config) (*Hook, error) {
	cfg = cfg.withDefaults()
	h := &Hook{
		tracer: tracer(cfg.TracerProvider),
		prop:   cfg.Propagator,
		system: cfg.System,
		group:  cfg.ConsumerGroup,
		parent: cfg.ParentOnProducer,
		perTx:  cfg.SpanPerTransaction,
		dests:  map[destKey]*destAttrs{},
	}
	var base []attribute.KeyValue
	if cfg.System != "" {
		base = append(base, AttrSystem.String(cfg.System))
	}
	if cfg.ConsumerGroup != "" {
		base = append(base, AttrConsumerGroup.String(cfg.ConsumerGroup))
	}
	h.noDest = newDest(nil, metric.WithAttributeSet(attribute.NewSet(base...)))
	h.noDest.spanName, h.noDest.batch = "process", h.noDest.rec
	h.kindOpt = trace.WithSpanKind(trace.SpanKindConsumer)
	h.claimOpts[dedup.StateNew] = trace.WithAttributes(AttrClaim.String("new"))
	h.claimOpts[dedup.StateDone] = trace.WithAttributes(AttrClaim.String("duplicate"))

	m := meter(cfg.MeterProvider)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	seconds := func(name, desc string) metric.Float64Histogram {
		c, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		errs = append(errs, err)
		return c
	}
	h.consumed = counter(MetricConsumed, "{message}", "Messages received from the broker.")
	h.duplicates = counter(MetricDuplicates, "{message}", "Messages acknowledged without running the handler, by idemq.duplicate.reason.")
	h.deadLetters = counter(MetricDeadLetters, "{message}", "Messages dead-lettered, by idemq.dead_letter.reason.")
	h.retries = counter(MetricRetries, "{message}", "Messages handed back for a later attempt, by idemq.retry.kind.")
	h.ackFailures = counter(MetricAckFailures, "{message}", "Messages whose acknowledgement failed after their effect was durable.")
	h.leaseRefreshFail = counter(MetricLeaseRefreshFailures, "{failure}", "Lease refreshes that failed (the lease store was unreachable).")
	h.leaseLost = counter(MetricLeaseLost, "{lease}", "Leases found lost while handling or waiting.")
	h.processDur = seconds(MetricProcessDuration, "Time from receipt to settlement of a message.")
	h.handlerDur = seconds(MetricHandlerDuration, "Handler run time, per attempt.")
	h.commitDur = seconds(MetricCommitDuration, "Time to make a message's effect durable (commit, or mark done).")
	h.clientDur = seconds(MetricOperationDuration, messagingconv.ClientOperationDuration{}.Description())
	var e [5]error
	h.inFlight, e[0] = m.Int64UpDownCounter(MetricInFlight, metric.WithUnit("{message}"), metric.WithDescription("Messages received and not settled yet."))
	h.batchSize, e[1] = m.Int64Histogram(MetricBatchSize, metric.WithUnit("{message}"), metric.WithDescription("Messages per batch formed by a lane."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000))
	h.meter = m
	h.lag, e[2] = m.Int64ObservableGauge(MetricKafkaLag, metric.WithUnit("{message}"),
		metric.WithDescription("Messages of a partition at and after the first one the consumer has not settled (high watermark minus the next offset to commit)."))
	h.dedupRecords, e[3] = m.Int64ObservableGauge(MetricDedupRecords, metric.WithUnit("{record}"),
		metric.WithDescription("Records in the dedup table, by scope, at the janitor's latest measurement."))
	h.dedupOldest, e[4] = m.Float64ObservableGauge(MetricDedupOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest record in the dedup table, by scope, at the janitor's latest measurement."))
	if err := errors.Join(append(errs, e[:]...)...); err != nil {
		return nil, fmt.Errorf("otelidemq: create instruments: %w", err)
	}
	return h, nil
}

// durationBuckets are the bucket boundaries (s) the messaging conventions
// advise for messaging.process.duration and
// messaging.client.operation.duration; idemq's own durations use them too.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// withDefaults returns c with the providers and the propagator its fields
// default to.
func (c Config) withDefaults() Config {
	c.TracerProvider = cmp.Or(c.TracerProvider, otel.GetTracerProvider())
	c.MeterProvider = cmp.Or(c.MeterProvider, otel.GetMeterProvider())
	c.Propagator = cmp.Or(c.Propagator, propagator())
	return c
}

// tracer returns the tracer of the instrumentation scope from tp.
func tracer(tp trace.TracerProvider) trace.Tracer {
	return tp.Tracer(ScopeName, trace.WithInstrumentationVersion(scopeVersion), trace.WithSchemaURL(SchemaURL))
}

// meter returns the meter of the instrumentation scope from mp.
func meter(mp metric.MeterProvider) metric.Meter {
	return mp.Meter(ScopeName, metric.WithInstrumentationVersion(scopeVersion), metric.WithSchemaURL(SchemaURL))
}

// Metric names.
const (
	MetricConsumed        = "messaging.client.consumed.messages"
	MetricProcessDuration = "messaging.process.duration"
	// MetricOperationDuration times the client operations: the runner's
	// acknowledgements and an outbox relay's sends (RelayHook).
	MetricOperationDuration    = "messaging.client.operation.duration"
	MetricDuplicates           = "idemq.duplicates"
	MetricDeadLetters          = "idemq.dead_letters"
	MetricRetries              = "idemq.retries"
	MetricAckFailures          = "idemq.ack.failures"
	MetricLeaseRefreshFailures = "idemq.lease.refresh_failures"
	MetricLeaseLost            = "idemq.lease.lost"
	MetricInFlight             = "idemq.in_flight"
	MetricBatchSize            = "idemq.batch.size"
	MetricHandlerDuration      = "idemq.handler.duration"
	MetricCommitDuration       = "idemq.commit.duration"
	MetricKafkaLag             = "idemq.kafka.lag"
	MetricDedupRecords         = "idemq.dedup.records"
	MetricDedupOldestAge       = "idemq.dedup.oldest_age"
)

// state is what a message's context carries from event to event. It is the
// message's context itself (one allocation for both), holding its process
// span (nil with SpanPerTransaction).
type state struct {
	context.Context
	span  trace.Span
	start time.Time
	dest  *destAttrs
}

type stateKey struct{}

// Value returns s for stateKey, else the value of its context.
func (s *state) Value(k any) any {
	if _, ok := k.(stateKey); ok {
		return s
	}
	return s.Context.Value(k)
}

func stateOf(ctx context.Context) *state {
	s, _ := ctx.Value(stateKey{}).(*state)
	return s
}

// destOf returns the destination of the message in ctx, else h.noDest.
func (h *Hook) destOf(ctx context.Context) *destAttrs {
	if s := stateOf(ctx); s != nil {
		return s.dest
	}
	return h.noDest
}

// errAttrs returns the error.type of err, or nothing without an error.
func errAttrs(err error) []attribute.KeyValue {
	if err == nil {
		return nil
	}
	return []attribute.KeyValue{AttrErrorType.String(errorType(err))}
}

// OnReceived starts the message's process span, parented on the producer's
// span found in its headers (with SpanPerTransaction, only takes the
// producer's span, to link to it), and counts it as consumed.
func (h *Hook) OnReceived(ctx context.Context, m *consumer.Message) context.Context {
	now := time.Now()
	ctx = Extract(ctx, h.prop, m)
	dest := h.attrsOf(h.keyOf(h.systemOf(m), m), &m.Broker)
	// The attributes a sampler may use are set at the start; the message's
	// own (its ID, attempt, offset, ...) are set with its outcome, in one
	// call, which saves the allocations of a start option per message.
	var span trace.Span
	if !h.perTx {
		if h.parent {
			ctx, span = h.tracer.Start(ctx, dest.spanName, h.kindOpt, dest.spanOpt, linkTo(ctx))
		} else {
			// A root span linked to the producer's: WithNewRoot ignores
			// the producer's span in ctx, and the span replaces it there.
			ctx, span = h.tracer.Start(ctx, dest.spanName, h.kindOpt, dest.spanOpt, trace.WithNewRoot(), linkTo(ctx))
		}
	}
	h.consumed.Add(ctx, 1, dest.add...)
	h.inFlight.Add(ctx, 1, dest.add...)
	return &state{Context: ctx, span: span, start: now, dest: dest}
}

// linkTo returns the option linking a span to the span context in ctx (the
// producer's, from its headers), or no link without one.
func linkTo(ctx context.Context) trace.SpanStartOption {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return trace.WithLinks()
	}
	return trace.WithLinks(trace.Link{SpanContext: sc})
}

// OnBatch records the batch's size, with the attributes of the latest
// message received but for its destination and partition (the hook is
// given no message, and a lane's batch may mix destinations).
func (h *Hook) OnBatch(ctx context.Context, size int) {
	d := h.lastDest.Load()
	if d == nil {
		d = h.noDest
	}
	h.batchSize.Record(ctx, int64(size), d.batch...)
}

// OnClaimed adds a "claim" child span when the claim was timed and claimed
// this message alone (a transaction's claim of several is one span, made
// by OnTx), and for a duplicate an event with its reason and a count by
// reason.
func (h *Hook) OnClaimed(ctx context.Context, m *consumer.Message, c consumer.ClaimInfo) {
	if !h.perTx && !c.Start.IsZero() && c.Messages <= 1 && c.State > 0 && int(c.State) < len(h.claimOpts) {
		timedSpan(ctx, h.tracer, "claim", c.Start, c.End, nil, h.claimOpts[c.State])
	}
	if c.State != dedup.StateDone {
		return
	}
	if c.Reason == consumer.DuplicateProducer && m != nil && m.Broker.UnmarkedRedeliveries {
		// A redelivery the broker did not mark looks like the producer's
		// re-send to the runner, so the reason is unknown.
		c.Reason = DuplicateUnknown
	}
	reason := AttrDuplicateReason.String(c.Reason.String())
	if !h.perTx {
		trace.SpanFromContext(ctx).AddEvent(EventDuplicate, trace.WithAttributes(reason))
	}
	if d := h.destOf(ctx); c.Reason >= 0 && int(c.Reason) < len(d.dups) {
		h.duplicates.Add(ctx, 1, d.dups[c.Reason]...)
	} else {
		h.duplicates.Add(ctx, 1, d.addWith(reason)...)
	}
}

// OnHandlerStart starts the "handler" child span; the handler's context
// carries it. With SpanPerTransaction it starts none.
func (h *Hook) OnHandlerStart(ctx context.Context, m *consumer.Message) context.Context {
	if h.perTx {
		return ctx
	}
	ctx, _ = h.tracer.Start(ctx, "handler")
	return ctx
}

// OnHandlerEnd ends the "handler" span, recording the handler's error, and
// records its duration.
func (h *Hook) OnHandlerEnd(ctx context.Context, m *consumer.Message, d time.Duration, err error) {
	h.handlerDur.Record(ctx, d.Seconds(), h.destOf(ctx).recWith(errAttrs(err)...)...)
	if h.perTx {
		return
	}
	span := trace.SpanFromContext(ctx)
	if err != nil {
		recordFailure(span, err)
	}
	span.End()
}

// OnCommit adds a "commit" child span and records the commit's duration,
// when the commit was of this message alone (a transaction's commit of
// several is one span and one measurement, made by OnTx).
func (h *Hook) OnCommit(ctx context.Context, m *consumer.Message, c consumer.CommitInfo) {
	if c.Start.IsZero() || c.Messages > 1 {
		return
	}
	if !h.perTx {
		timedSpan(ctx, h.tracer, "commit", c.Start, c.End, c.Err)
	}
	h.commitDur.Record(ctx, c.End.Sub(c.Start).Seconds(), h.destOf(ctx).rec...)
}

// OnTx makes the root spans of the work a transaction does once for
// several messages: a "claim" span when it claimed more than one key, and
// a "handler" (a batch handler's call) and a "commit" span when more than
// one message was new, each linked to the process spans of the messages it
// covered; it records the batch handler's and the commit's durations once.
// With SpanPerTransaction it makes the transaction's process span and its
// children instead (txProcess).
func (h *Hook) OnTx(ctx context.Context, t consumer.TxInfo) {
	d := h.noDest
	if len(t.Claimed) > 0 {
		if s := stateOf(t.Claimed[0]); s != nil {
			d = s.dest
		}
	}
	switch {
	case h.perTx:
		h.txProcess(ctx, d, t)
	case len(t.Claimed) > 1 && !t.ClaimStart.IsZero():
		h.txSpan(ctx, "claim", d, t.Claimed, nil, t.ClaimStart, t.ClaimEnd, t.ClaimErr)
	}
	if len(t.New) <= 1 {
		return
	}
	var links []trace.Link
	if !t.HandlerStart.IsZero() {
		if !h.perTx {
			links = h.txSpan(ctx, "handler", d, t.New, nil, t.HandlerStart, t.HandlerEnd, t.HandlerErr)
		}
		h.handlerDur.Record(ctx, t.HandlerEnd.Sub(t.HandlerStart).Seconds(), d.recWith(errAttrs(t.HandlerErr)...)...)
	}
	if c := t.Commit; !c.Start.IsZero() {
		if !h.perTx {
			h.txSpan(ctx, "commit", d, t.New, links, c.Start, c.End, c.Err)
		}
		h.commitDur.Record(ctx, c.End.Sub(c.Start).Seconds(), d.rec...)
	}
}

// txSpan makes a span of a transaction's work over msgs (message contexts)
// from start to end, linked to their spans (links, or made from msgs when
// links is nil), and returns the links.
func (h *Hook) txSpan(ctx context.Context, name string, d *destAttrs, msgs []context.Context, links []trace.Link, start, end time.Time, err error) []trace.Link {
	if links == nil {
		links = linksTo(msgs)
	}
	attrs := make([]attribute.KeyValue, 0, len(d.kvs)+1)
	attrs = append(append(attrs, d.kvs...), AttrBatchCount.Int(len(msgs)))
	timedSpan(ctx, h.tracer, name, start, end, err, trace.WithNewRoot(), trace.WithLinks(links...), trace.WithAttributes(attrs...))
	return links
}

// timedSpan makes a span of work done from start to end, with err recorded
// on it (recordFailure) when not nil.
func timedSpan(ctx context.Context, t trace.Tracer, name string, start, end time.Time, err error, opts ...trace.SpanStartOption) {
	_, span := t.Start(ctx, name, append(opts, trace.WithTimestamp(start))...)
	if err != nil {
		recordFailure(span, err)
	}
	span.End(trace.WithTimestamp(end))
}

// linksTo returns links to the spans of the contexts that carry one.
func linksTo(ctxs []context.Context) []trace.Link {
	links := make([]trace.Link, 0, len(ctxs))
	for _, c := range ctxs {
		if sc := trace.SpanContextFromContext(c); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}

// recordFailure records err on span as an exception event and sets its
// status to Error and its error.type. The event's exception.type is the
// type of the cause (see causeOf), not of the wrappers around it; a
// panic's stack is its exception.stacktrace.
func recordFailure(span trace.Span, err error) {
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{semconv.ExceptionType(typeName(causeOf(err))), semconv.ExceptionMessage(err.Error())}
	var p *consumer.PanicError
	if errors.As(err, &p) && len(p.Stack) > 0 {
		attrs = append(attrs, semconv.ExceptionStacktrace(string(p.Stack)))
	}
	span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(attrs...))
	span.SetAttributes(AttrErrorType.String(errorType(err)))
	span.SetStatus(codes.Error, err.Error())
}

// causeOf returns the error that err wraps at the end of its chain: through
// Unwrap() error, and through the last error of Unwrap() []error (where
// idemq and fmt.Errorf("%w: %w", sentinel, cause) put the cause).
func causeOf(err error) error {
	for {
		next := errors.Unwrap(err)
		if multi, ok := err.(interface{ Unwrap() []error }); ok { //nolint:errorlint // walks the chain itself
			if errs := multi.Unwrap(); len(errs) > 0 {
				next = errs[len(errs)-1]
			}
		}
		if next == nil {
			return err
		}
		err = next
	}
}

// typeName names the type of v as the SDK's RecordError does for
// exception.type: package path and name for a named type, else the type's
// string ("*pkg.Type").
func typeName(v any) string {
	t := reflect.TypeOf(v)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String()
	}
	return t.PkgPath() + "." + t.Name()
}

// txProcess makes the process span of a transaction (SpanPerTransaction)
// from the start of its claim to the end of the last work it did, with a
// child span for each of its claim, batch handler call and commit, as
// "Span per transaction" in the package documentation describes.
func (h *Hook) txProcess(ctx context.Context, d *destAttrs, t consumer.TxInfo) {
	type step struct {
		name       string
		start, end time.Time
		err        error
	}
	steps := [...]step{
		{"claim", t.ClaimStart, t.ClaimEnd, t.ClaimErr},
		{"handler", t.HandlerStart, t.HandlerEnd, t.HandlerErr},
		{"commit", t.Commit.Start, t.Commit.End, t.Commit.Err},
	}
	var start, end time.Time
	var failed error
	for _, st := range steps {
		if st.start.IsZero() {
			continue
		}
		if start.IsZero() {
			start = st.start
		}
		end = st.end
		if failed == nil {
			failed = st.err
		}
	}
	if start.IsZero() || len(t.Claimed) == 0 {
		return
	}
	attrs := make([]attribute.KeyValue, 0, len(d.spanKVs)+2)
	attrs = append(append(attrs, d.spanKVs...), AttrBatchCount.Int(len(t.Claimed)), AttrBatchNew.Int(len(t.New)))
	pctx, span := h.tracer.Start(ctx, d.spanName, trace.WithNewRoot(), h.kindOpt, trace.WithTimestamp(start),
		trace.WithLinks(linksTo(t.Claimed)...), trace.WithAttributes(attrs...))
	for _, st := range steps {
		if st.start.IsZero() {
			continue
		}
		timedSpan(pctx, h.tracer, st.name, st.start, st.end, st.err)
	}
	if failed != nil {
		span.SetAttributes(AttrErrorType.String(errorType(failed)))
		span.SetStatus(codes.Error, failed.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// systemOf returns messaging.system for m: Config.System, else the
// message's Broker.System, else "idemq".
func (h *Hook) systemOf(m *consumer.Message) string {
	switch {
	case h.system != "":
		return h.system
	case m.Broker.System != "":
		return m.Broker.System
	}
	return systemUnknown
}

// OnAck records the acknowledgement's messaging.client.operation.duration
// (operation type settle, named by the source's BrokerInfo.SettleName, "ack"
// by default), with the destination when all its messages share one, and
// error.type when it failed, and counts the messages of a failed
// acknowledgement.
func (h *Hook) OnAck(ctx context.Context, a consumer.AckInfo) {
	if a.Err != nil {
		h.ackFailures.Add(ctx, int64(len(a.Messages)), h.noDest.add...)
	}
	if len(a.Messages) == 0 {
		return
	}
	first := a.Messages[0]
	system := h.systemOf(first)
	k := h.keyOf(system, first)
	d := h.attrsOf(k, &first.Broker)
	opt := d.settle
	for _, m := range a.Messages[1:] {
		if mk := h.keyOf(system, m); mk.topic != k.topic || mk.dest != k.dest {
			opt = d.settleAny
			break
		}
	}
	if a.Err != nil {
		opt = append(opt[:len(opt):len(opt)], metric.WithAttributes(AttrErrorType.String(errorType(a.Err))))
	}
	h.clientDur.Record(ctx, a.End.Sub(a.Start).Seconds(), opt...)
}

// OnRetry adds a retry event and counts it by kind.
func (h *Hook) OnRetry(ctx context.Context, m *consumer.Message, kind consumer.RetryKind, delay time.Duration, err error) {
	k := AttrRetryKind.String(kind.String())
	if !h.perTx {
		attrs := []attribute.KeyValue{k, attribute.String("idemq.retry.delay", delay.String())}
		if err != nil {
			attrs = append(attrs, attribute.String("exception.message", err.Error()))
		}
		trace.SpanFromContext(ctx).AddEvent(EventRetry, trace.WithAttributes(attrs...))
	}
	if d := h.destOf(ctx); kind >= 0 && int(kind) < len(d.retries) {
		h.retries.Add(ctx, 1, d.retries[kind]...)
	} else {
		h.retries.Add(ctx, 1, d.addWith(k)...)
	}
}

// OnDeadLetter adds a dead-letter event, sets the span's status to Error
// and its error.type, and counts it by reason.
func (h *Hook) OnDeadLetter(ctx context.Context, m *consumer.Message, reason consumer.DeadLetterReason, err error) {
	r := AttrDeadLetter.String(string(reason))
	if !h.perTx {
		span := trace.SpanFromContext(ctx)
		span.AddEvent(EventDeadLetter, trace.WithAttributes(r))
		if err != nil {
			span.SetAttributes(AttrErrorType.String(errorType(err)))
			span.SetStatus(codes.Error, err.Error())
		}
	}
	h.deadLetters.Add(ctx, 1, h.destOf(ctx).addWith(r)...)
}

// OnLeaseLost adds a lease-lost event and counts it.
func (h *Hook) OnLeaseLost(ctx context.Context, m *consumer.Message, err error) {
	if !h.perTx {
		trace.SpanFromContext(ctx).AddEvent(EventLeaseLost)
	}
	h.leaseLost.Add(ctx, 1, h.destOf(ctx).add...)
}

// OnLeaseRefreshFailed counts a failed lease refresh.
func (h *Hook) OnLeaseRefreshFailed(ctx context.Context, err error) {
	h.leaseRefreshFail.Add(ctx, 1, h.noDest.add...)
}

// OnSettled ends the process span with the outcome and records the
// processing duration.
func (h *Hook) OnSettled(ctx context.Context, m *consumer.Message, s consumer.SettleInfo) {
	st := stateOf(ctx)
	if st == nil {
		return
	}
	now := time.Now()
	outcome := AttrOutcome.String(s.Outcome.String())
	if st.span != nil {
		b := &m.Broker
		attrs := make([]attribute.KeyValue, 0, 3+len(b.MessageAttrs))
		attrs = append(attrs, outcome, AttrAttempt.Int(m.Attempt))
		// A synthetic ID (a log's topic, partition and offset) is no ID of
		// the message's own; where the message sits has attributes of its
		// own.
		if m.ID != "" && !b.SyntheticID {
			attrs = append(attrs, AttrMessageID.String(m.ID))
		}
		for _, a := range b.MessageAttrs {
			if a.Key != "" {
				attrs = append(attrs, kv(a))
			}
		}
		st.span.SetAttributes(attrs...)
	}
	opt := st.dest.outcomes[consumer.OutcomeLeft]
	if s.Outcome >= 0 && int(s.Outcome) < len(st.dest.outcomes) {
		opt = st.dest.outcomes[s.Outcome]
	}
	switch s.Outcome {
	case consumer.OutcomeRetried, consumer.OutcomeDeadLettered, consumer.OutcomeLeft:
		if s.Err != nil {
			opt = st.dest.recWith(outcome, AttrErrorType.String(errorType(s.Err)))
		}
	}
	h.processDur.Record(ctx, now.Sub(st.start).Seconds(), opt...)
	h.inFlight.Add(ctx, -1, st.dest.add...)
	if st.span != nil {
		st.span.End()
	}
}

// errorType names an error for the error.type attribute: the idemq
// sentinel it matches, else "permanent" for a permanent error, else
// "_OTHER".
func errorType(err error) string {
	for _, s := range []struct {
		err  error
		name string
	}{
		{consumer.ErrMaxAttempts, "max_attempts"},
		{consumer.ErrPayloadMismatch, "payload_mismatch"},
		{consumer.ErrMissingKey, "missing_key"},
		{consumer.ErrInvalidKey, "invalid_key"},
		{consumer.ErrOversized, "oversized"},
		{consumer.ErrMalformed, "malformed"},
		{consumer.ErrHandlerPanic, "panic"},
		{consumer.ErrCommit, "commit"},
		{context.DeadlineExceeded, "timeout"},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	if consumer.IsPermanent(err) {
		return "permanent"
	}
	return "_OTHER"
}
