// Package otelidemq traces and measures idemq consumers with OpenTelemetry.
//
// It is a consumer.Hook: create one with New and pass it in
// consumer.Config.Hooks. It uses only the OpenTelemetry API; the application
// installs the SDK (tracer and meter providers, exporters) and passes the
// providers in Config, or sets them globally.
//
//	hook, err := otelidemq.New(otelidemq.Config{ConsumerGroup: "orders"})
//	...
//	runner, err := consumer.NewRunner(src, path, consumer.Config{Name: "orders", Hooks: []consumer.Hook{hook}})
//
// # Traces
//
// Every delivery gets one "process <destination>" span of kind consumer,
// from receipt to settlement (after the acknowledgement), whose parent is the
// producer's span taken from the message's headers: W3C traceparent and
// tracestate (Kafka headers, SQS message attributes, AMQP headers), or the
// SQS AWSTraceHeader system attribute. Child spans: "claim" (the key's claim;
// on the transactional path the begin and claim of the message's last
// transaction), "handler" (each attempt), "commit" (lease path: marking the
// key done; transactional path: each commit of a transaction holding the
// message, with status Error when it failed). A duplicate is an
// "idemq.duplicate" event with its reason (redelivery, concurrent, producer;
// see consumer.DuplicateReason), not an error; retries, dead letters and lost
// leases are events too, and a dead letter sets the span's status to Error.
//
// The handler's context carries the handler span, so spans and trace-aware
// log lines made by the handler join the message's trace, and Inject writes
// it into outgoing requests (sinks/webhook does).
//
// # Metrics
//
// See the README's Observability section for every instrument, its unit
// and attributes: messaging.client.consumed.messages and
// messaging.process.duration from the messaging semantic conventions, and
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
// RelayHook measures a sinks/outbox Relay: pass NewRelayHook's result in
// outbox.Config.Hooks. It counts the rows published by outcome
// (messaging.client.sent.messages), times each batch's publish
// (messaging.client.operation.duration), and reads the rows pending and
// parked and the age of the oldest pending row from the outbox table at each
// collection (idemq.outbox.pending, idemq.outbox.parked,
// idemq.outbox.oldest_pending.age).
package otelidemq
