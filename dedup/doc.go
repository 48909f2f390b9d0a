// Package dedup defines what idemq needs from a deduplication store and the
// types every store shares: records, payload digests, claim states and errors.
//
// There are two kinds of store, one per delivery path:
//
//   - TxStore records a processed key in the same database transaction as the
//     handler's business mutation. The record and the effect commit together,
//     so there is no duplicate window. Implementations: dedup/pgdedup
//     (PostgreSQL through pgx v5) and dedup/sqldedup (database/sql).
//
//   - LeaseStore guards effects that cannot join a transaction with a
//     token-checked lease: claim, refresh, complete, abandon. A crash after the
//     effect and before Complete lets the effect repeat once the lease expires;
//     the key handed to the handler lets the downstream system close that
//     window. Implementation: dedup/redisdedup.
//
// Both kinds may also implement FailureCounter, which counts handler failures
// per key outside the failed transaction, so that a retry policy's attempt
// limit counts the message's failures and not its deliveries (a consumer that
// crashed or was killed while holding a message is not the message's fault).
// All three stores do.
//
// A store whose janitor measures its table (records per scope, the oldest
// record) implements TableStatsReporter: pgdedup and sqldedup do, and
// consumer/otelidemq exports the measurement as gauges.
//
// A store whose tables its Migrate creates implements SchemaChecker, so that
// the Runner refuses to start without them: pgdedup and sqldedup do.
//
// A store whose server can be set up to lose writes it acknowledged (Redis
// without an fsync'ed append-only file) implements DurabilityReporter: the
// Runner reads the settings once when Run starts and warns, or refuses to
// start when the store is told to (redisdedup.Config.RequireDurable).
//
// # Optional interfaces
//
// Besides TxStore or LeaseStore, a store may implement optional interfaces;
// the runner finds them by type assertion and does without them otherwise
// (each interface's doc says what it changes). Which store implements which
// (x: yes; generic interfaces for the store's own Tx; memdedup is idemq's
// in-memory store for its own tests):
//
//	interface            pgdedup  sqldedup  redisdedup  memdedup.Store  memdedup.Leases
//	TxStore              x        x         .           x               .
//	BeginClaimer         x        .         .           .               .
//	CommitChainer        x        .         .           .               .
//	AbortClassifier      x        x         .           .               .
//	FailedTxReporter     x        .         .           .               .
//	EndedTxReporter      x        .         .           .               .
//	TransientClassifier  x        x         .           .               .
//	PoolSizer            x        x         .           .               .
//	RetentionReporter    x        x         .           x               .
//	TableStatsReporter   x        x         .           .               .
//	SchemaChecker        x        x         .           .               .
//	LeaseStore           .        .         x           .               x
//	BatchClaimer         .        .         x           .               .
//	FailureCounter       x        x         x           x               x
//	ResultStorer         x        x         .           x               .
//	ResultCompleter      .        .         x           .               x
//	DurabilityReporter   .        .         x           .               .
//
// Each store package asserts its row of this table at compile time
// (capabilities.go), and a test in dedup/deduptest checks the table against
// the stores. A wrapper around a store (consumer/consumertest's) must
// forward every optional interface its store has, or the runner takes
// another path with the wrapper than without it.
//
// Every store runs the conformance suites in dedup/deduptest against a real
// server.
package dedup
