package otelidemq

import (
	"context"
	"encoding/hex"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/consumer"
)

// HeaderAWSTrace is the SQS system attribute carrying an AWS X-Ray trace
// header; sources/sqssource surfaces it in Message.Headers.
const HeaderAWSTrace = "AWSTraceHeader"

// defaultPropagator is used while the global propagator is the no-op one.
var defaultPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// propagator returns the global propagator, or W3C trace context and
// baggage while none is set.
func propagator() propagation.TextMapPropagator {
	p := otel.GetTextMapPropagator()
	if len(p.Fields()) == 0 {
		return defaultPropagator
	}
	return p
}

// Inject writes the span context of ctx (and its baggage) into carrier with
// the global propagator, or W3C trace context and baggage while none is set,
// so that the downstream system's spans join the message's trace. Call it
// on an outgoing request made from a handler (with a
// propagation.HeaderCarrier), or give a sink Propagator() instead. Without
// a span in ctx it writes nothing.
func Inject(ctx context.Context, carrier propagation.TextMapCarrier) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator().Inject(ctx, carrier)
}

// Propagator returns the propagator the hook uses by default, for the
// sinks' Config.Propagator (sinks/webhook):
//
//	sink, err := webhook.New(webhook.Config{URL: url, Propagator: otelidemq.Propagator()})
//
// It injects as Inject does (the global propagator's fields, or W3C trace
// context and baggage while none is set, and nothing without a span in
// ctx) and extracts with the same propagator. It reads the global
// propagator at each call, so one set after it was made is used.
func Propagator() propagation.TextMapPropagator {
	return globalPropagator{}
}

// globalPropagator is Propagator's propagation.TextMapPropagator.
type globalPropagator struct{}

func (globalPropagator) Inject(ctx context.Context, carrier propagation.TextMapCarrier) {
	Inject(ctx, carrier)
}

func (globalPropagator) Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	return propagator().Extract(ctx, carrier)
}

func (globalPropagator) Fields() []string {
	return propagator().Fields()
}

// Extract returns ctx with the producer's span context found in m's headers
// as its remote parent: what p finds (W3C traceparent and tracestate by
// default: Kafka headers, SQS message attributes, AMQP headers), else an
// AWS X-Ray trace header (the SQS AWSTraceHeader system attribute, which
// sources/sqssource puts in Message.Headers). Without either, ctx is
// returned unchanged.
func Extract(ctx context.Context, p propagation.TextMapPropagator, m *consumer.Message) context.Context {
	if len(m.Headers) == 0 {
		return ctx
	}
	if p == nil {
		p = propagator()
	}
	out := p.Extract(ctx, propagation.MapCarrier(m.Headers))
	if trace.SpanContextFromContext(out).IsRemote() {
		return out
	}
	if sc, ok := parseXRay(m.Headers[HeaderAWSTrace]); ok {
		return trace.ContextWithRemoteSpanContext(out, sc)
	}
	return out
}

// parseXRay reads an X-Ray trace header,
// "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1".
// A header without both ids gives no valid span context.
func parseXRay(h string) (trace.SpanContext, bool) {
	var cfg trace.SpanContextConfig
	for part := range strings.SplitSeq(h, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "Root":
			// 1-<8 hex epoch>-<24 hex>
			f := strings.Split(v, "-")
			if len(f) != 3 || f[0] != "1" || len(f[1]) != 8 || len(f[2]) != 24 {
				return trace.SpanContext{}, false
			}
			b, err := hex.DecodeString(f[1] + f[2])
			if err != nil {
				return trace.SpanContext{}, false
			}
			copy(cfg.TraceID[:], b)
		case "Parent":
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != 8 {
				return trace.SpanContext{}, false
			}
			copy(cfg.SpanID[:], b)
		case "Sampled":
			if v == "1" {
				cfg.TraceFlags = trace.FlagsSampled
			}
		}
	}
	cfg.Remote = true
	sc := trace.NewSpanContext(cfg)
	return sc, sc.IsValid()
}
