// Package dedup defines the types every deduplication store shares: records,
// payload digests, claim states, stored results, table statistics and errors.
//
// There are two kinds of store, one per delivery path:
//
//   - A transactional store records a processed key in the same database
//     transaction as the handler's business mutation. The record and the
//     effect commit together, so there is no duplicate window.
//     Implementations: dedup/pgdedup (PostgreSQL through pgx v5) and
//     dedup/sqldedup (database/sql). Hand one to consumer.Transactional.
//
//   - A lease store guards effects that cannot join a transaction with a
//     token-checked lease: claim, refresh, complete, abandon. A crash after
//     the effect and before it is marked done lets the effect repeat once the
//     lease expires; the key handed to the handler lets the downstream system
//     close that window. Implementation: dedup/redisdedup. Hand one to
//     consumer.Leased.
//
// A user calls a store's own methods (New, Migrate, Inspect, Purge, stats,
// its janitor) and hands it to the Runner; the protocol between the Runner
// and the store is the store's driver, in dedup/dedupdriver, which only
// those who write or wrap a store need to read. It is one interface per
// path, with the store's capabilities as a value (dedupdriver.Caps, with
// the table of which store can do what) instead of optional interfaces, so
// that a wrapper forwarding the driver cannot make the Runner take another
// path.
//
// A store whose janitor measures its table (records per scope, the oldest
// record) implements TableStatsReporter: pgdedup and sqldedup do, and
// consumer/otelidemq exports the measurement as gauges.
//
// Every store runs the conformance suites in dedup/deduptest against a real
// server.
package dedup
