// Package testenv tells tests where the real services they need are running:
// PostgreSQL, Redis, RabbitMQ, Apache Kafka and an SQS-compatible server
// (ElasticMQ).
//
// Each address getter (DatabaseURL, RedisURL, AMQPURL, KafkaBrokers,
// SQSEndpoint) resolves its service in this order:
//
//  1. the environment variable (TEST_DATABASE_URL, TEST_REDIS_URL,
//     TEST_AMQP_URL, TEST_KAFKA_BROKERS, TEST_SQS_ENDPOINT), used as given;
//  2. the env file that testdata/services/services.sh writes into its state
//     directory (${IDEMQ_SERVICES_DIR:-$HOME/.cache/idemq/services}/env),
//     if the address there answers;
//  3. the default loopback address, if it answers;
//  4. a container, when a Docker engine is configured: the program in
//     testdata/containers (a module of its own, built on testcontainers-go,
//     so that idemq's module does not depend on it) starts the service once
//     per test process on a free loopback port, and removes it when the
//     process ends;
//  5. otherwise the test fails with a message that says to run
//     `make services`. A missing service is never a silent skip.
//
// Under go test -short every getter skips its test instead, with a message
// naming the service: -short promises tests that need no service (make
// test-short), whether or not one is running.
//
// Restart, Stop and Start run services.sh (or ask the container program) to
// bounce one service on the same port and data directory, for reconnect
// tests. StartDurableSQS runs an SQS server of one test's own that keeps its
// messages across a restart. Schema and SchemaURL give
// each test its own PostgreSQL schema, dropped when the test ends, so that
// test packages running in parallel against one database do not collide.
//
// testenv imports no broker SDK (kafka-go, amqp091-go, the AWS SDK): the
// core packages' tests import it, and a user's `go mod tidy` resolves their
// imports. Helpers that speak a broker's protocol are in package brokerenv.
//
// The package is for idemq's own tests; it lives under internal/ so that no
// user imports it.
package testenv
