// Package brokerenv holds the test helpers that speak a broker's own
// protocol: deleting RabbitMQ queues and exchanges, Kafka topics and SQS
// queues when a test ends, and reading a Kafka partition's end offset.
//
// They live apart from package testenv so that testenv imports no broker
// SDK: the core packages' tests (consumer, dedup/pgdedup) import testenv,
// and `go mod tidy` in a user's module resolves the imports of those tests
// too. A helper that needs kafka-go, amqp091-go or the AWS SDK belongs here,
// not in testenv (bash .ci/deps-weight enforces it).
//
// The package is for idemq's own tests; it lives under internal/ so that no
// user imports it.
package brokerenv
