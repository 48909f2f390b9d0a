package otelidemq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/dedup/memdedup"
)

// telemetry is an SDK tracer provider with an in-memory span recorder and a
// meter provider with a ManualReader.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	hook   *otelidemq.Hook
}

func newTelemetry(t *testing.T, cfg otelidemq.Config) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	cfg.TracerProvider, cfg.MeterProvider = tp, mp
	h, err := otelidemq.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tel.hook = h
	return tel
}

// producerSpan starts a span as a producer would and returns its context
// and the headers carrying it.
func producerSpan(t *testing.T) (trace.SpanContext, map[string]string) {
	t.Helper()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("producer").Start(context.Background(), "send", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	headers := map[string]string{}
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(headers))
	if headers["traceparent"] == "" {
		t.Fatal("no traceparent injected")
	}
	return span.SpanContext(), headers
}

// processSpans returns the ended process spans, by message ID ("" for
// those without one: Kafka's, and a message without an ID).
func (tel *telemetry) processSpans() map[string][]sdktrace.ReadOnlySpan {
	out := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range tel.spans.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		id, _ := attr(s, otelidemq.AttrMessageID)
		out[id.AsString()] = append(out[id.AsString()], s)
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// checkProcessSpan asserts that s is a process span whose parent is the
// producer's span, with the messaging attributes.
func checkProcessSpan(t *testing.T, s sdktrace.ReadOnlySpan, parent trace.SpanContext, system, destination string) {
	t.Helper()
	if s.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("span %q kind %v, want consumer", s.Name(), s.SpanKind())
	}
	if got := s.Parent(); got.TraceID() != parent.TraceID() || got.SpanID() != parent.SpanID() || !got.IsRemote() {
		t.Errorf("process span parent %s/%s (remote %v), want the producer's %s/%s",
			got.TraceID(), got.SpanID(), got.IsRemote(), parent.TraceID(), parent.SpanID())
	}
	if s.Name() != "process "+destination {
		t.Errorf("span name %q, want %q", s.Name(), "process "+destination)
	}
	want := map[attribute.Key]string{
		otelidemq.AttrSystem:        system,
		otelidemq.AttrDestination:   destination,
		otelidemq.AttrOperationType: "process",
	}
	for k, v := range want {
		if got, ok := attr(s, k); !ok || got.AsString() != v {
			t.Errorf("attribute %s = %q (present %v), want %q", k, got.AsString(), ok, v)
		}
	}
	for _, k := range []attribute.Key{otelidemq.AttrMessageID, otelidemq.AttrConsumerGroup, otelidemq.AttrOutcome, otelidemq.AttrAttempt} {
		if _, ok := attr(s, k); !ok {
			t.Errorf("attribute %s missing", k)
		}
	}
	if v, ok := attr(s, otelidemq.AttrBatchCount); ok {
		t.Errorf("single-message span has %s %v", otelidemq.AttrBatchCount, v.String())
	}
	if l := s.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != parent.SpanID() {
		t.Errorf("process span links %v, want one to the producer's span", l)
	}
}

// children returns the names of the spans whose parent is s.
func (tel *telemetry) children(s sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, c := range tel.spans.Ended() {
		if c.Parent().SpanID() == s.SpanContext().SpanID() {
			out[c.Name()] = c
		}
	}
	return out
}

// covering returns the spans named name that cover the process span s:
// its children, and the spans of a transaction's work linked to it.
func (tel *telemetry) covering(s sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, c := range tel.spans.Ended() {
		if c.Name() != name {
			continue
		}
		if c.Parent().SpanID() == s.SpanContext().SpanID() {
			out = append(out, c)
			continue
		}
		for _, l := range c.Links() {
			if l.SpanContext.SpanID() == s.SpanContext().SpanID() {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// checkLinkedSpans asserts that every span with links is a root span whose
// messaging.batch.message_count is its number of links, and returns the
// number of such spans by name.
func (tel *telemetry) checkLinkedSpans(t *testing.T) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, c := range tel.spans.Ended() {
		if len(c.Links()) == 0 {
			continue
		}
		n[c.Name()]++
		if c.Parent().IsValid() {
			t.Errorf("%s span with links has a parent", c.Name())
		}
		if v, ok := attr(c, otelidemq.AttrBatchCount); !ok || v.AsInt64() != int64(len(c.Links())) {
			t.Errorf("%s span: %s %v, %d links", c.Name(), otelidemq.AttrBatchCount, v.AsInt64(), len(c.Links()))
		}
	}
	return n
}

// spanCount returns the number of ended spans named name.
func (tel *telemetry) spanCount(name string) int {
	n := 0
	for _, c := range tel.spans.Ended() {
		if c.Name() == name {
			n++
		}
	}
	return n
}

func runIdle(t *testing.T, r *consumer.Runner, between ...func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	for _, f := range append([]func(){func() {}}, between...) {
		f()
		if err := r.WaitIdle(ctx, 500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// With ParentOnProducer, the process span of a message is parented on (and
// linked to) the producer's span carried in its traceparent header, has the messaging attributes, and has claim,
// handler and commit children (lease path); the handler's context carries
// the handler span, in the same trace. A redelivered duplicate is an event,
// not an error.
func TestProcessSpanParentedOnProducer(t *testing.T) {
	parent, headers := producerSpan(t)
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: "orders-consumer", ParentOnProducer: true})
	store := memStore(t)
	b := memBroker(t, memsource.Config{VisibilityTimeout: 100 * time.Millisecond})
	b.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit})
	ids := b.Publish("orders", memsource.Outgoing{Key: "k1", Body: []byte("b"), Headers: headers})

	var mu sync.Mutex
	var handlerSpans []trace.SpanContext
	path := consumer.Leased(store.Leases(), func(ctx context.Context, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handlerSpans = append(handlerSpans, trace.SpanContextFromContext(ctx))
		return nil
	}, consumer.LeaseOptions{})
	r := tel.runner(t, b.Source("orders"), path, consumer.Config{Name: "orders-consumer", Concurrency: 1})
	runIdle(t, r)
	if st := r.Stats(); st.Handled != 1 || st.Duplicates != 1 {
		t.Fatalf("stats %+v, want 1 handled and 1 duplicate (the dropped ack's redelivery)", st)
	}

	spans := tel.processSpans()[ids[0]]
	if len(spans) != 2 {
		t.Fatalf("%d process spans for the message, want 2 (delivery and redelivery)", len(spans))
	}
	for _, s := range spans {
		checkProcessSpan(t, s, parent, "idemq", "orders")
	}
	first, second := spans[0], spans[1]
	if v, _ := attr(first, otelidemq.AttrOutcome); v.AsString() != "handled" {
		first, second = second, first
	}
	kids := tel.children(first)
	for _, name := range []string{"claim", "handler", "commit"} {
		if _, ok := kids[name]; !ok {
			t.Errorf("process span has no %q child (children: %v)", name, kids)
		}
	}
	if len(handlerSpans) != 1 || handlerSpans[0].SpanID() != kids["handler"].SpanContext().SpanID() || handlerSpans[0].TraceID() != parent.TraceID() {
		t.Errorf("handler's context span %v, want the handler span in the producer's trace", handlerSpans)
	}
	if second.Status().Code == codes.Error {
		t.Errorf("duplicate's span has status Error")
	}
	var found bool
	for _, e := range second.Events() {
		if e.Name == otelidemq.EventDuplicate {
			for _, a := range e.Attributes {
				found = found || (a.Key == otelidemq.AttrDuplicateReason && a.Value.AsString() == "redelivery")
			}
		}
	}
	if !found {
		t.Errorf("duplicate's span events %v, want %s with reason redelivery", second.Events(), otelidemq.EventDuplicate)
	}
}

// A message without trace headers starts a new trace.
func TestProcessSpanWithoutHeadersIsRoot(t *testing.T) {
	tel := newTelemetry(t, otelidemq.Config{})
	store := memStore(t)
	b := memBroker(t, memsource.Config{})
	b.Publish("t", memsource.Outgoing{Key: "k"})
	r := tel.runner(t, b.Source("t"), consumer.Transactional(store, succeed), consumer.Config{})
	runIdle(t, r)
	for _, ss := range tel.processSpans() {
		for _, s := range ss {
			if s.Parent().IsValid() {
				t.Errorf("process span has parent %v, want none", s.Parent())
			}
		}
	}
}

// metrics collects the ManualReader's data: the sum of every counter by
// metric name and attribute value of key (or "" for the total).
func (tel *telemetry) metrics(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

func sum(rm metricdata.ResourceMetrics, name string, key attribute.Key, value string) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			match := func(set attribute.Set) bool {
				if key == "" {
					return true
				}
				v, ok := set.Value(key)
				return ok && v.AsString() == value
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						n += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						n += int64(p.Count)
					}
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						n += int64(p.Count)
					}
				}
			}
		}
	}
	return n
}

// The counters read through a ManualReader equal Runner.Stats after a run
// with a concurrent duplicate, a producer re-send, redeliveries, a failed
// ack, retries and dead letters.
func TestMetricsMatchStats(t *testing.T) {
	for name, leased := range map[string]bool{"transactional": false, "leased": true} {
		t.Run(name, func(t *testing.T) {
			tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: "hooks"})
			store := memStore(t)
			b := memBroker(t, memsource.Config{VisibilityTimeout: 100 * time.Millisecond, Seed: 1})
			b.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Key: "drop"})
			b.Inject(memsource.Fault{Kind: memsource.AckError, Key: "ackerr"})
			var mu sync.Mutex
			calls := map[string]int{}
			h := func(ctx context.Context, m *consumer.Message) error {
				mu.Lock()
				calls[m.Key]++
				n := calls[m.Key]
				mu.Unlock()
				switch {
				case m.Key == "retry" && n == 1:
					return errors.New("downstream busy")
				case m.Key == "perm":
					return consumer.Permanent(errors.New("refused"))
				case m.Key == "max":
					return errors.New("always failing")
				}
				return nil
			}
			var path consumer.Path
			if leased {
				path = consumer.Leased(store.Leases(), h, consumer.LeaseOptions{})
			} else {
				path = consumer.Transactional(store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error { return h(ctx, m) })
			}
			r := tel.runner(t, b.Source("t"), path, consumer.Config{
				Name: "hooks", Concurrency: 1, BatchSize: 10,
				Retry: consumer.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Jitter: -1},
			})
			for _, k := range []string{"a", "same", "same", "re", "drop", "ackerr", "retry", "perm", "max"} {
				b.Publish("t", memsource.Outgoing{Key: k, Body: []byte("body-" + k)})
			}
			runIdle(t, r, func() { b.Publish("t", memsource.Outgoing{Key: "re", Body: []byte("body-re")}) })
			st := r.Stats()
			rm := tel.metrics(t)

			checks := []struct {
				what string
				got  int64
				want uint64
			}{
				{"consumed", sum(rm, otelidemq.MetricConsumed, "", ""), st.Received},
				{"process durations", sum(rm, otelidemq.MetricProcessDuration, "", ""), st.Received},
				{"handled outcomes", sum(rm, otelidemq.MetricProcessDuration, otelidemq.AttrOutcome, "handled"), st.Handled},
				{"duplicates", sum(rm, otelidemq.MetricDuplicates, "", ""), st.Duplicates},
				{"retries", sum(rm, otelidemq.MetricRetries, "", ""), st.Retried},
				{"dead letters", sum(rm, otelidemq.MetricDeadLetters, "", ""), st.DeadLettered},
				{"ack failures", sum(rm, otelidemq.MetricAckFailures, "", ""), st.AckFailures},
				{"in flight", sum(rm, otelidemq.MetricInFlight, "", ""), 0},
				{"batch sizes", sum(rm, otelidemq.MetricBatchSize, "", ""), 0},
			}
			for _, c := range checks {
				if c.what == "batch sizes" {
					if c.got == 0 {
						t.Errorf("no batch sizes recorded")
					}
					continue
				}
				if uint64(c.got) != c.want {
					t.Errorf("%s: metric %d, Stats %d (%+v)", c.what, c.got, c.want, st)
				}
			}
			// "same" is concurrent when both copies meet in one batch, else
			// producer; "re" is producer; "drop" and "ackerr" redeliveries.
			if n := sum(rm, otelidemq.MetricDuplicates, otelidemq.AttrDuplicateReason, "redelivery"); n < 2 {
				t.Errorf("duplicates by redelivery: %d, want at least 2", n)
			}
			if n := sum(rm, otelidemq.MetricDuplicates, otelidemq.AttrDuplicateReason, "concurrent") +
				sum(rm, otelidemq.MetricDuplicates, otelidemq.AttrDuplicateReason, "producer"); n < 2 {
				t.Errorf("duplicates by concurrent or producer: %d, want at least 2", n)
			}
			for _, reason := range []string{"permanent", "max_attempts"} {
				if n := sum(rm, otelidemq.MetricDeadLetters, otelidemq.AttrDeadLetter, reason); n != 1 {
					t.Errorf("dead letters with reason %s: %d, want 1", reason, n)
				}
			}
			if sum(rm, otelidemq.MetricRetries, otelidemq.AttrRetryKind, "handler") < 2 {
				t.Errorf("handler retries below 2")
			}
			if sum(rm, otelidemq.MetricHandlerDuration, "", "") == 0 {
				t.Errorf("no handler durations")
			}
			// One commit duration per commit: per message on the lease
			// path, per transaction on the transactional path.
			if n, spans := sum(rm, otelidemq.MetricCommitDuration, "", ""), tel.spanCount("commit"); n != int64(spans) || n == 0 ||
				(leased && uint64(n) != st.Handled) || (!leased && uint64(n) >= st.Handled) {
				t.Errorf("commit durations %d, commit spans %d, Stats.Handled %d", n, spans, st.Handled)
			}
			tel.checkLinkedSpans(t)
			if st.Duplicates == 0 || st.Retried == 0 || st.DeadLettered == 0 || st.AckFailures == 0 {
				t.Fatalf("the run did not exercise everything: %+v", st)
			}
		})
	}
}

// On the transactional path, a batch rerun without a failed handler's
// message, then a failed commit and its retry: the claim and the commit of
// a transaction of several messages are one span each, linked to their
// process spans; every process span of a handled message is covered by
// claim and commit spans and has a handler child per call, with one
// successful commit; a delivery whose transaction failed to commit is
// covered by one commit span with status Error; one whose handler failed by
// none.
func TestTransactionalSpans(t *testing.T) {
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: "tx"})
	store := memStore(t)
	store.Inject(memdedup.Fault{Kind: memdedup.CommitError})
	b := memBroker(t, memsource.Config{VisibilityTimeout: 100 * time.Millisecond, Seed: 1})
	var mu sync.Mutex
	calls := map[string]int{}
	path := consumer.Transactional(store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls[m.Key]++
		if m.Key == "bad" && calls[m.Key] == 1 {
			return errors.New("downstream busy")
		}
		return nil
	})
	r := tel.runner(t, b.Source("t"), path, consumer.Config{
		Name: "tx", Concurrency: 1, BatchSize: 10,
		// The four messages share a transaction however the receiver
		// hands them over (one at a time on a slow machine); the wait
		// stays well inside the broker's visibility timeout.
		BatchWait: 30 * time.Millisecond,
		Retry:     consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Jitter: -1},
	})
	for _, k := range []string{"a", "b", "bad", "c"} {
		b.Publish("t", memsource.Outgoing{Key: k, Body: []byte("body-" + k)})
	}
	runIdle(t, r)
	st := r.Stats()
	if st.Handled != 4 || st.CommitFailures != 1 {
		t.Fatalf("stats %+v, want 4 handled and 1 commit failure", st)
	}
	// A handler may run more than once within one delivery: when a
	// batch-mate fails, the transaction is rolled back and rerun without it.
	// Every call must show as one handler span of its delivery.
	var handled, failedCommits, handlerSpans int
	for id, spans := range tel.processSpans() {
		for _, s := range spans {
			claims, handlers := len(tel.covering(s, "claim")), len(tel.covering(s, "handler"))
			var okCommits, badCommits int
			for _, c := range tel.covering(s, "commit") {
				if c.Status().Code == codes.Error {
					badCommits++
				} else {
					okCommits++
				}
			}
			handlerSpans += handlers
			outcome, _ := attr(s, otelidemq.AttrOutcome)
			switch outcome.AsString() {
			case "handled":
				handled++
				if claims < 1 || handlers < 1 || okCommits != 1 || badCommits != 0 {
					t.Errorf("handled delivery %s: %d claim, %d handler, %d commit, %d failed commit spans; want at least 1, at least 1, 1, 0",
						id, claims, handlers, okCommits, badCommits)
				}
			case "retried":
				failedCommits += badCommits
				if claims < 1 || okCommits != 0 || badCommits > 1 {
					t.Errorf("retried delivery %s: %d claim, %d commit, %d failed commit spans; want at least 1, 0, at most 1",
						id, claims, okCommits, badCommits)
				}
			default:
				t.Errorf("delivery %s: outcome %q", id, outcome.AsString())
			}
		}
	}
	mu.Lock()
	var handlerCalls int
	for _, n := range calls {
		handlerCalls += n
	}
	mu.Unlock()
	if handlerSpans != handlerCalls {
		t.Errorf("%d handler spans for %d handler calls, want one span per call", handlerSpans, handlerCalls)
	}
	if handled != 4 || failedCommits == 0 {
		t.Errorf("%d handled deliveries and %d failed commit spans; want 4 and at least 1", handled, failedCommits)
	}
	if n, spans := sum(tel.metrics(t), otelidemq.MetricCommitDuration, "", ""), tel.spanCount("commit"); n != int64(spans) {
		t.Errorf("%d commit durations, want one per commit span (%d)", n, spans)
	}
	if linked := tel.checkLinkedSpans(t); linked["claim"] == 0 || linked["commit"] == 0 || linked["handler"] != 0 {
		t.Errorf("spans with links by name %v: want claim and commit, and no handler (per-message handlers)", linked)
	}
}

// Inject writes the handler's span into an outgoing carrier, so that the
// downstream's spans join the trace; without a span it writes nothing.
func TestInject(t *testing.T) {
	c := propagation.MapCarrier{}
	otelidemq.Inject(context.Background(), c)
	if len(c) != 0 {
		t.Fatalf("injected %v without a span", c)
	}
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "handler")
	defer span.End()
	otelidemq.Inject(ctx, c)
	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), c))
	if got.SpanID() != span.SpanContext().SpanID() || got.TraceID() != span.SpanContext().TraceID() {
		t.Fatalf("extracted %v from %v, want the span %v", got, c, span.SpanContext())
	}
}

// Propagator, the sinks' option, injects as Inject does: the span and its
// baggage, and nothing without a span; it extracts what it injects.
func TestPropagator(t *testing.T) {
	p := otelidemq.Propagator()
	member, err := baggage.NewMember("tenant", "t1")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	ctx := baggage.ContextWithBaggage(context.Background(), bag)
	c := propagation.MapCarrier{}
	p.Inject(ctx, c)
	if len(c) != 0 {
		t.Fatalf("injected %v without a span", c)
	}
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(ctx, "handler")
	defer span.End()
	p.Inject(ctx, c)
	if c.Get("traceparent") == "" || c.Get("baggage") != "tenant=t1" {
		t.Fatalf("injected %v, want a traceparent and the baggage", c)
	}
	out := p.Extract(context.Background(), c)
	if got := trace.SpanContextFromContext(out); got.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("extracted span %v, want %v", got, span.SpanContext())
	}
	if got := baggage.FromContext(out).Member("tenant").Value(); got != "t1" {
		t.Fatalf("extracted baggage tenant=%q, want t1", got)
	}
	if f := p.Fields(); !slices.Contains(f, "traceparent") || !slices.Contains(f, "baggage") {
		t.Fatalf("Fields %v, want traceparent and baggage", f)
	}
}

// An SQS AWSTraceHeader parents the span when no traceparent is present.
func TestExtractAWSTraceHeader(t *testing.T) {
	m := &consumer.Message{Headers: map[string]string{
		otelidemq.HeaderAWSTrace: "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
	}}
	sc := trace.SpanContextFromContext(otelidemq.Extract(context.Background(), nil, m))
	if sc.TraceID().String() != "5759e988bd862e3fe1be46a994272793" || sc.SpanID().String() != "53995c3f42cd8ad8" || !sc.IsSampled() || !sc.IsRemote() {
		t.Fatalf("span context %v", sc)
	}
	for _, bad := range []string{"Root=1-xx;Parent=53995c3f42cd8ad8", "Root=1-5759e988-bd862e3fe1be46a994272793", "garbage"} {
		m.Headers[otelidemq.HeaderAWSTrace] = bad
		if sc := trace.SpanContextFromContext(otelidemq.Extract(context.Background(), nil, m)); sc.IsValid() {
			t.Errorf("%q gave %v, want none", bad, sc)
		}
	}
}

// batchRunner returns a memsource broker and a TransactionalBatch runner
// (batch 10, one lane, quick retries) consuming topic with tel's hook. Its
// batch handler takes {"K": ...} bodies and fails once, naming the message
// whose K is bad; calls returns how many times it ran.
func batchRunner(t *testing.T, tel *telemetry, name, topic, bad string) (b *memsource.Broker, r *consumer.Runner, calls func() int) {
	t.Helper()
	store := memStore(t)
	b = memsource.New(memsource.Config{VisibilityTimeout: 100 * time.Millisecond, Seed: 1})
	t.Cleanup(func() { b.Close() })
	type order struct{ K string }
	var mu sync.Mutex
	batchCalls, failedOnce := 0, false
	path := consumer.TransactionalBatch(store, consumer.TxBatchJSON(func(ctx context.Context, _ *memdedup.Tx, items []consumer.BatchItem[order]) error {
		mu.Lock()
		defer mu.Unlock()
		batchCalls++
		for _, it := range items {
			if it.Value.K == bad && !failedOnce {
				failedOnce = true
				return &consumer.MessageError{Msg: it.Msg, Err: errors.New("downstream busy")}
			}
		}
		return nil
	}))
	r = tel.runner(t, b.Source(topic), path, consumer.Config{
		// A short BatchWait gathers the messages published before Run into
		// one batch (without it the lane may start with the first alone),
		// well inside the broker's 100 ms visibility timeout.
		Name: name, Concurrency: 1, BatchSize: 10, BatchWait: 20 * time.Millisecond,
		Retry: consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Jitter: -1},
	})
	return b, r, func() int {
		mu.Lock()
		defer mu.Unlock()
		return batchCalls
	}
}

// The batch API is traced and measured per transaction where the work is
// per transaction: each handler call over several messages is one handler
// span linked to their process spans, with one handler duration (with
// error.type when it failed, a MessageError included); claims and commits
// are spans linked the same way, with one commit duration each; every
// handled delivery is covered by claim, handler and commit spans; and
// duplicates and batches are counted.
func TestTransactionalBatchSpansAndMetrics(t *testing.T) {
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: "txbatch"})
	b, r, batchCalls := batchRunner(t, tel, "txbatch", "t", "bad")
	ks := []string{"a", "b", "bad", "c"}
	for _, k := range ks {
		b.Publish("t", memsource.Outgoing{Key: k, Body: []byte(`{"K":"` + k + `"}`)})
	}
	runIdle(t, r, func() { b.Publish("t", memsource.Outgoing{Key: "a", Body: []byte(`{"K":"a"}`)}) })
	st := r.Stats()
	if st.Handled != 4 || st.Duplicates != 1 {
		t.Fatalf("stats %+v, want 4 handled and 1 duplicate", st)
	}

	var handled int
	for id, spans := range tel.processSpans() {
		for _, s := range spans {
			if outcome, _ := attr(s, otelidemq.AttrOutcome); outcome.AsString() == "handled" {
				handled++
				for _, name := range []string{"claim", "handler", "commit"} {
					if len(tel.covering(s, name)) == 0 {
						t.Errorf("handled delivery %s: no %q span, child or linked", id, name)
					}
				}
			}
		}
	}
	var handlerSpans, failedHandlerSpans int
	for _, c := range tel.spans.Ended() {
		if c.Name() == "handler" {
			handlerSpans++
			if c.Status().Code == codes.Error {
				failedHandlerSpans++
			}
		}
	}
	handlerCalls := batchCalls()
	if handled != 4 || handlerSpans != handlerCalls || failedHandlerSpans != 1 {
		t.Errorf("%d handled deliveries, %d handler spans (%d failed) for %d handler calls; want 4, one per call, 1 failed",
			handled, handlerSpans, failedHandlerSpans, handlerCalls)
	}
	if linked := tel.checkLinkedSpans(t); linked["claim"] == 0 || linked["handler"] == 0 || linked["commit"] == 0 {
		t.Errorf("spans with links by name %v: want claim, handler and commit", linked)
	}
	rm := tel.metrics(t)
	if n := sum(rm, otelidemq.MetricHandlerDuration, "", ""); n != int64(handlerCalls) {
		t.Errorf("%d handler durations, want one per call (%d)", n, handlerCalls)
	}
	if n := sum(rm, otelidemq.MetricHandlerDuration, otelidemq.AttrErrorType, "_OTHER"); n != 1 {
		t.Errorf("%d failed handler durations, want 1", n)
	}
	if n := sum(rm, otelidemq.MetricDuplicates, otelidemq.AttrDuplicateReason, "producer"); n != 1 {
		t.Errorf("%d producer duplicates counted, want 1", n)
	}
	if n, spans := sum(rm, otelidemq.MetricCommitDuration, "", ""), tel.spanCount("commit"); n != int64(spans) || n == 0 {
		t.Errorf("%d commit durations, want one per commit span (%d)", n, spans)
	}
	if n := sum(rm, otelidemq.MetricBatchSize, "", ""); n == 0 {
		t.Error("no batch size recorded")
	}
}

// With SpanPerTransaction, a TransactionalBatch runner makes one process
// span per transaction, linked to the producer's span of each message it
// claimed, with claim, handler and commit children, and none per message;
// the metrics are those of the per-message mode.
func TestSpanPerTransaction(t *testing.T) {
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: "pertx", SpanPerTransaction: true})
	b, r, batchCalls := batchRunner(t, tel, "pertx", "orders", "k7")
	producers := map[trace.SpanID]bool{}
	var msgs []memsource.Outgoing
	for i := range 25 {
		sc, headers := producerSpan(t)
		producers[sc.SpanID()] = true
		msgs = append(msgs, memsource.Outgoing{Key: fmt.Sprintf("k%d", i), Body: []byte(fmt.Sprintf(`{"K":"k%d"}`, i)), Headers: headers})
	}
	b.Publish("orders", msgs...)
	runIdle(t, r, func() { b.Publish("orders", msgs[3]) })
	st := r.Stats()
	if st.Handled != 25 || st.Duplicates != 1 || st.Retried != 1 {
		t.Fatalf("stats %+v, want 25 handled, 1 duplicate, 1 retried", st)
	}

	linked := map[trace.SpanID]int{}
	var process, failed int
	for _, s := range tel.spans.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		process++
		if s.Name() != "process orders" || s.Parent().IsValid() {
			t.Errorf("consumer span %q with parent %v, want a root %q", s.Name(), s.Parent(), "process orders")
		}
		n, ok := attr(s, otelidemq.AttrBatchCount)
		if !ok || n.AsInt64() != int64(len(s.Links())) {
			t.Errorf("process span: %s %v, %d links (every message carried a traceparent)", otelidemq.AttrBatchCount, n.AsInt64(), len(s.Links()))
		}
		for _, l := range s.Links() {
			linked[l.SpanContext.SpanID()]++
		}
		kids := tel.children(s)
		if _, ok := kids["claim"]; !ok {
			t.Errorf("process span without a claim child: %v", kids)
		}
		if s.Status().Code == codes.Error {
			failed++
			if h, ok := kids["handler"]; !ok || h.Status().Code != codes.Error {
				t.Errorf("failed process span: handler child %v", kids)
			}
		} else if nw, _ := attr(s, otelidemq.AttrBatchNew); nw.AsInt64() > 0 {
			if _, ok := kids["commit"]; !ok {
				t.Errorf("committed process span without a commit child: %v", kids)
			}
		}
	}
	calls := batchCalls()
	if process != calls+1 || failed != 1 {
		t.Errorf("%d process spans (%d failed) for %d batch calls; want one per transaction (each call, and the re-send's claim), 1 failed", process, failed, calls)
	}
	for id := range producers {
		if linked[id] == 0 {
			t.Errorf("producer span %s linked from no process span", id)
		}
	}
	for _, name := range []string{"handler", "claim", "commit"} {
		for _, s := range tel.spans.Ended() {
			if s.Name() == name && !s.Parent().IsValid() {
				t.Errorf("%s span is a root span, want a child of a process span", name)
			}
		}
	}
	rm := tel.metrics(t)
	if n := sum(rm, otelidemq.MetricConsumed, "", ""); n != 27 {
		t.Errorf("%d consumed, want 27 (25, a retry and a re-send)", n)
	}
	if n := sum(rm, otelidemq.MetricDuplicates, otelidemq.AttrDuplicateReason, "producer"); n != 1 {
		t.Errorf("%d producer duplicates counted, want 1", n)
	}
	if n := sum(rm, otelidemq.MetricHandlerDuration, "", ""); n != int64(calls) {
		t.Errorf("%d handler durations, want one per call (%d)", n, calls)
	}
}
