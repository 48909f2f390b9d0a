// Package memdedup is the in-memory deduplication store, the fake that unit
// tests and the demo use in place of a database: a
// dedupdriver.TxStore[*memdedup.Tx] for the transactional path and, through
// Store.Leases, a dedupdriver.LeaseStore for the lease path, with the semantics of
// the real stores, an event log and scripted faults.
//
// # Semantics
//
// A Tx collects claims and effects (Tx.Add) and makes them visible together
// at Commit, or not at all. Claim blocks, honouring its context, while
// another open transaction holds an uncommitted claim on the same key, and
// then sees that transaction's outcome: a commit makes the key StateDone (or
// StateMismatch for a different payload digest), a rollback or Unclaim makes
// it StateNew for the waiter. Keys are taken in ascending order, so
// concurrent claims cannot deadlock. Savepoint and RollbackToSavepoint undo
// claims and effects made since the last savepoint. Records expire after
// Config.Retention, measured with Config.Now, so tests can move time
// forward.
//
// The lease path follows dedupdriver.Lease: a token-guarded lease that
// expires, can be refreshed, completed (kept for the retention) or abandoned.
//
// # Observation and faults
//
// Every begin, commit, failed commit, rollback and lease completion is
// numbered in one sequence and appended to the log returned by Events; the
// same Event is passed to Config.OnEvent before the operation returns, so a
// test can merge it with the acknowledgements of a source and check that no
// message was acknowledged before the commit that recorded its key. Inject
// scripts failures of Begin, Claim, Commit and RecordFailure (BeginError,
// ClaimError, CommitError, RecordFailureError: kinds of FaultKind, the one
// vocabulary every in-memory kit speaks under the same names), including a
// commit whose outcome is reported as failed although it happened.
//
// # Duplicate window
//
// Like the PostgreSQL store, the transactional path has none: a record and
// the effects of its transaction become visible in one step. The lease path
// keeps the window of every lease store: an effect that happened before a
// crash and before Complete can happen again once the lease expires.
//
// A Store is safe for concurrent use; a Tx must be used by one goroutine at a
// time. Nothing is persisted: the package is meant for unit tests, the
// source conformance suite and the demo, never for production.
package memdedup
