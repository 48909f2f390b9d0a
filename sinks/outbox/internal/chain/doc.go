// Package chain holds the end-to-end test of the outbox across two
// consumers: consumer A (Kafka source, charge and outbox row in one
// PostgreSQL transaction) → relay (RabbitMQ) → consumer B (RabbitMQ source,
// Redis lease path, webhook sink), with each of the three processes
// SIGKILLed several times. It has no code of its own.
package chain
