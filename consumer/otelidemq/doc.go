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
// # Traces
//
// Every delivery gets one "process <destination>" span of kind consumer,
// from receipt to settlement (after the acknowledgement), linked to the
// producer's span taken from the message's headers (its creation context):
// W3C traceparent and tracestate (Kafka headers, SQS message attributes,
// AMQP headers), or the SQS AWSTraceHeader system attribute. As the
// messaging semantic conventions advise, the span is a root span by
// default; Config.ParentOnProducer makes it the producer span's child too.
//
// Attribute keys and values come from go.opentelemetry.io/otel/semconv
// (v1.41.0, SchemaURL), so that they cannot drift from the conventions.
// What is particular to a broker comes from consumer.Message.Broker, which
// the sources fill and the hook copies without knowing the broker:
// messaging.system, server.address and server.port, the destination's
// attributes (the consumer group, the partition, a destination name other
// than the topic, ...) on the process span, and on the metrics those the
// messaging conventions list for metrics (messaging.consumer.group.name,
// messaging.destination.partition.id, messaging.destination.subscription.name
// and messaging.destination.template), the message's own attributes (an
// offset, a delivery tag, ...) at its settlement, and the broker's name for
// an acknowledgement; docs/observability.md lists what each source fills.
// The work done for it is traced where it is done: per message, or once per
// transaction, following the messaging conventions for batches.
//
//   - "handler": a child span per attempt of a per-message handler (lease
//     path, Transactional); a batch handler's call (TransactionalBatch) over
//     several messages is one "handler" span for the call.
//   - "claim": lease path: a child span per claim of the message's key;
//     transactional path: one span per transaction for the begin and claim
//     of all its keys.
//   - "commit": lease path: a child span for marking the key done;
//     transactional path: one span per commit tried, with status Error when
//     it failed.
//
// A span made once per transaction is a root span linked to the process
// spans of the messages it covered (its claimed messages, or the new ones
// the handler and the commit covered), with messaging.batch.message_count;
// a transaction of one message gets child spans instead. The SDK keeps 128
// links per span by default (sdktrace.SpanLimits.LinkCountLimit): raise it
// for larger batches. A duplicate is an
// "idemq.duplicate" event with its reason (redelivery, concurrent, producer,
// and unknown in place of producer where the broker does not mark every
// redelivery: see DuplicateUnknown and consumer.DuplicateReason), not an
// error; retries, dead letters and lost
// leases are events too, and a dead letter sets the span's status to Error.
//
// A per-message handler's context carries its handler span, so spans and
// trace-aware log lines made by the handler join the message's trace, and
// Inject writes it into outgoing requests (sinks/webhook does). A batch
// handler's context carries no message's span, since it handles many.
//
// Histograms record what they measure where it happens: the processing
// duration per message, the handler's duration per call (per message, or
// per batch call), the commit's duration per commit (per transaction on
// the transactional path).
//
// # Span per transaction
//
// With Config.SpanPerTransaction the hook makes one "process <destination>"
// span per transaction of the transactional path instead of one per
// message, as the messaging conventions trace batch processing: a root span
// of kind consumer from the transaction's claim to its commit, linked to
// the producer's span of every message it claimed, with
// messaging.batch.message_count (messages claimed) and
// idemq.batch.new_count (claimed as new), status Error when its claim,
// batch handler or commit failed, and "claim", "handler" (a batch
// handler's call) and "commit" children. The metrics are the same. Not
// traced in this mode: a per-message handler's calls (their durations are
// measured), span events (duplicates, retries, dead letters and lost
// leases are counted only), and messages settled outside a transaction
// (the lease path; a dead letter for a missing or invalid key or an
// oversized body).
// The handler's context carries the producer's span context, not a span of
// its own.
//
// # Metrics
//
// See docs/observability.md for every instrument, its unit
// and attributes: messaging.client.consumed.messages,
// messaging.process.duration and messaging.client.operation.duration (each
// acknowledgement, operation type settle) from the messaging semantic
// conventions, with their advised histogram buckets, and
// idemq.duplicates, idemq.dead_letters, idemq.retries, idemq.ack.failures,
// idemq.lease.refresh_failures, idemq.lease.lost, idemq.in_flight,
// idemq.batch.size, idemq.handler.duration and idemq.commit.duration.
// ObserveLag adds the idemq.kafka.lag gauge for a source that reports its
// lag per partition (consumer.LagReporter: kafkasource), and ObserveDedup
// the idemq.dedup.records and idemq.dedup.oldest_age gauges for a store
// whose janitor measures its table (dedup.TableStatsReporter: pgdedup,
// sqldedup).
//
// # Outbox relay
//
// RelayHook measures and traces a sinks/outbox Relay: pass NewRelayHook's
// result in outbox.Config.Hooks.
package otelidemq
