// Package otelidemq traces and measures idemq consumers with OpenTelemetry.
//
// It is a consumer.Hook: create one with New and pass it in
// consumer.Config.Hooks. It uses only the OpenTelemetry API; the application
// installs the SDK (tracer and meter providers, exporters) and passes the
// providers in Config, or sets them globally.
//
//	hook, err := otelidemq.New(otelidemq.Config{})
//	...
//	runner, err := consumer.NewRunner(src, path, consumer.Config{Name: "orders", Hooks: []consumer.Hook{hook}})
//
// docs/observability.md is the reference: every span, attribute and
// instrument, what each source fills, the Grafana dashboard and the cost.
//
// # Traces
//
// Every delivery gets one "process <destination>" span of kind consumer,
// from receipt to settlement, linked to the producer's span found in the
// message's headers (Extract); Config.ParentOnProducer makes it the
// producer span's child too. Work done per message is a "handler", "claim"
// or "commit" child span; work a transaction does once for several messages
// is one root span linked to the process spans of the messages it covered,
// with messaging.batch.message_count. Duplicates, retries, dead letters and
// lost leases are span events, and a dead letter sets the span's status to
// Error. A per-message handler's context carries its handler span, which
// Inject writes into outgoing requests; a batch handler's carries none.
// Attribute keys and values come from go.opentelemetry.io/otel/semconv
// (SchemaURL); what is particular to a broker comes from
// consumer.Message.Broker, which the hook copies without knowing the broker.
//
// # Span per transaction
//
// With Config.SpanPerTransaction the hook makes one "process <destination>"
// span per transaction of the transactional path instead of one per
// message: a root span of kind consumer from the transaction's claim to its
// commit, linked to the producer's span of every message it claimed, with
// messaging.batch.message_count (messages claimed) and
// idemq.batch.new_count (claimed as new), status Error when its claim,
// batch handler or commit failed, and "claim", "handler" and "commit"
// children. The metrics are the same. Not traced in this mode: a
// per-message handler's calls, span events, and messages settled outside a
// transaction (the lease path; a dead letter for a missing or invalid key
// or an oversized body).
//
// # Metrics
//
// The Metric constants name the instruments. ObserveLag adds the Kafka lag
// gauge (consumer.LagReporter) and ObserveDedup the dedup table's gauges
// (dedup.TableStatsReporter). RelayHook measures and traces a sinks/outbox
// Relay.
package otelidemq
