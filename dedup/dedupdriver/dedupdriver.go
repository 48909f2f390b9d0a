// Package dedupdriver is the protocol between the consumer.Runner and a
// deduplication store: one driver interface per delivery path (Tx for the
// transactional path, Lease for the lease path), the capabilities a driver
// reports as a value (Caps), and ErrUnsupported for what it cannot do.
//
// Users of idemq do not need this package: they build a store
// (pgdedup.New, sqldedup.New, redisdedup.New) and hand it to
// consumer.Transactional or consumer.Leased, which ask it for its driver
// (TxStore, LeaseStore). It is for those who write a store, or wrap one (to
// count, trace or inject faults): a wrapper implements the one driver
// interface of its path, forwards Caps, and the Runner takes the same paths
// with the wrapper as without it. No method is found by type assertion.
//
// # Capabilities
//
// Every method of a driver is required. A method whose capability the
// driver's Caps does not report is never called by the Runner; it returns
// ErrUnsupported (or the zero value, for a method without an error). Which
// store reports what (x: yes; memdedup is idemq's in-memory store for its
// own tests):
//
//	Caps field        pgdedup  sqldedup  redisdedup  memdedup.Store  memdedup.Leases
//	BeginClaim        x        .         .           .               .
//	CommitChain       x        .         .           .               .
//	Aborted           x        x         .           .               .
//	FailedTx          x        .         .           .               .
//	EndedTx           x        .         .           .               .
//	Transient         x        x         .           .               .
//	Pool              x        x         .           .               .
//	Retention         x        x         .           x               .
//	SchemaCheck       x        x         .           .               .
//	FailureCount      x        x         x           x               x
//	Results           x        x         x           x               x
//	BatchClaim        .        .         x           .               .
//	Durability        .        .         x           .               .
//
// (Retention is a duration: x means the driver reports one.) A test in
// dedup/deduptest checks this table against the stores' drivers, and one in
// consumer checks that the Runner takes the paths it names.
//
// Every store runs the conformance suites of dedup/deduptest against a real
// server.
package dedupdriver

import (
	"context"
	"errors"
	"time"

	"github.com/idemq/idemq/dedup"
)

// ErrUnsupported is returned by a driver method whose capability the
// driver's Caps does not report. The Runner never calls such a method; a
// wrapper that forwards one gets it back.
var ErrUnsupported = errors.New("dedupdriver: not supported by this store")

// Caps is what a driver can do beyond its path's required minimum. The zero
// value is a driver that does only that minimum: Begin, Claim, Commit and
// Rollback for Tx; Claim, Refresh, Complete, Abandon and Inspect for Lease.
// A driver's Caps does not change over its life.
type Caps struct {
	// BeginClaim: Tx.BeginClaim sends the begin and the claim in one round
	// trip. Without it the Runner calls Begin, then Claim.
	BeginClaim bool
	// CommitChain: Tx.CommitChain commits and begins and claims the next
	// batch in one round trip (PostgreSQL's COMMIT AND CHAIN). Without it
	// the Runner commits and begins each batch on its own.
	CommitChain bool
	// Aborted: Tx.IsAborted recognises the error of a statement refused
	// because its transaction had already failed. Without it no error is
	// taken for one, and a failed handler is always the culprit.
	Aborted bool
	// FailedTx: Tx.Failed tells, without a round trip, that a
	// transaction has failed.
	FailedTx bool
	// EndedTx: Tx.Ended tells, without a round trip, that a handler ended
	// the transaction itself, and Tx.ForgetEnded undoes what that made
	// durable.
	EndedTx bool
	// Transient: Tx.IsTransient recognises the typed driver errors of
	// transient database conditions, which the Runner retries without
	// counting an attempt. Without it every handler error is counted.
	Transient bool
	// Pool: Tx.PoolSize reports the size of the connection pool the
	// transactions draw on, which consumer.NewRunner checks Concurrency
	// against.
	Pool bool
	// Retention is how long the store keeps a processed record, which the
	// Runner compares with its source's redelivery horizon; 0 when the
	// driver does not say (a Lease driver: the lease path's retention is
	// LeaseOptions.Retention).
	Retention time.Duration
	// SchemaCheck: CheckSchema tells whether the store's tables exist.
	SchemaCheck bool
	// FailureCount: RecordFailure and ForgetFailures count the handler
	// failures of each key. Without it the retry policy counts the
	// broker's deliveries.
	FailureCount bool
	// Results: Tx.StoreResults (Lease.CompleteWithResult) keeps the result
	// of a handler with its record, for Claim to return to later
	// deliveries. Without it a handler that sets a result is refused.
	Results bool
	// BatchClaim: Lease.ClaimBatch claims many keys in one round trip.
	// Without it the lease path claims each key when its turn comes.
	BatchClaim bool
	// Durability: Durability reads the server's persistence settings,
	// which the Runner asks once when Run starts (a server that can lose
	// what it acknowledged forgets processed keys).
	Durability bool
}

// TxStore is a store of the transactional path: what
// consumer.Transactional takes. Driver returns the same driver on every
// call.
type TxStore[T any] interface {
	Driver() Tx[T]
}

// LeaseStore is a store of the lease path: what consumer.Leased takes.
// Driver returns the same driver on every call.
type LeaseStore interface {
	Driver() Lease
}

// Common is what the drivers of both paths have.
type Common interface {
	// Caps returns what the driver can do. It is the same on every call.
	Caps() Caps
	// CheckSchema reports whether the tables and columns the store uses
	// exist, without reading or writing any row: a *dedup.SchemaError
	// (matching dedup.ErrNotMigrated) when they do not, another error when
	// the database could not be asked. The Runner calls it once when Run
	// starts and refuses to start on dedup.ErrNotMigrated. ErrUnsupported
	// without Caps.SchemaCheck.
	CheckSchema(ctx context.Context) error
	// RecordFailure adds one handler failure to rec.Key in scope and
	// returns the number of failures recorded for it, this one included: 1
	// for the first failure, the first after the count expired or was
	// forgotten, or the first with a payload digest other than the one
	// counted so far.
	//
	// The count lets a retry policy's attempt limit count the message's
	// failures rather than its deliveries (a consumer that crashed while
	// holding the message is not the message's fault). The Runner calls
	// RecordFailure only after a handler failed, outside the transaction
	// that rolled the failure back, and ForgetFailures after it
	// dead-lettered a message for exhausting its attempts. A count expires
	// with the store's retention after its last failure. Concurrent calls
	// for one key and payload each return a distinct count.
	// ErrUnsupported without Caps.FailureCount.
	RecordFailure(ctx context.Context, scope string, rec dedup.Record) (failures int, err error)
	// ForgetFailures deletes the failure count of key in scope. Forgetting
	// a key without a count is not an error. ErrUnsupported without
	// Caps.FailureCount.
	ForgetFailures(ctx context.Context, scope, key string) error
	// Durability reads the persistence settings of a server that can be
	// set up to acknowledge a write before it is safe from a restart or a
	// crash (Redis without an fsync'ed append-only file), and says in
	// dedup.Durability.Loss whether such a write can be lost: a record
	// lost that way is a processed key forgotten. The Runner asks once,
	// when Run starts: a Loss is logged at WARN and reported in
	// consumer.Health.StoreLoss; an error matching dedup.ErrNotDurable (the
	// store was told to refuse such a server) stops Run; another error is
	// logged and Run goes on unchecked. ErrUnsupported without
	// Caps.Durability.
	Durability(ctx context.Context) (dedup.Durability, error)
}

// Tx is the driver of the transactional path: it records processed keys
// inside the same transaction as the handler's own writes. T is the
// transaction type handlers receive (pgx.Tx for pgdedup, *sql.Tx for
// sqldedup).
//
// The Runner drives one transaction per batch, with no savepoint per
// message (a writing savepoint costs a subtransaction XID per message, and
// more than 64 in one transaction overflow PostgreSQL's subtransaction
// cache):
//
//	Begin → Claim(all keys) → the handlers of the new keys → Commit
//
// When a handler fails, the Runner rolls the whole transaction back (the
// failed message's record and writes with it) and runs the batch again
// without the culprit, so a driver needs no way to undo part of a
// transaction.
//
// Implementations must be safe for concurrent use by multiple goroutines;
// each transaction is used by one goroutine at a time.
type Tx[T any] interface {
	Common

	// Begin starts a transaction.
	Begin(ctx context.Context) (T, error)
	// Commit commits tx. An error means the commit did not happen or its
	// outcome is unknown: the caller must not acknowledge anything recorded
	// in tx. An error matching dedup.ErrTxRefused says the outcome is known
	// (nothing committed) and the transaction's own content is at fault.
	Commit(ctx context.Context, tx T) error
	// Rollback rolls tx back. It is safe to call after Commit.
	Rollback(ctx context.Context, tx T) error
	// Claim records recs in tx under scope and reports, in the order of
	// recs, whether each key is new, already done or a payload mismatch.
	// Keys are locked in ascending key order, so concurrent batches cannot
	// deadlock on them. If another transaction holds an uncommitted claim
	// on a key, Claim waits for it to finish: a commit makes the key
	// dedup.StateDone (or dedup.StateMismatch), a rollback makes it
	// dedup.StateNew for this caller. recs must not contain a key twice. A
	// claim of a done record returns its stored result in Claim.Result.
	Claim(ctx context.Context, tx T, scope string, recs []dedup.Record) ([]dedup.Claim, error)

	// BeginClaim is Begin followed by Claim, sent in one round trip. On an
	// error no transaction is left open. ErrUnsupported without
	// Caps.BeginClaim.
	BeginClaim(ctx context.Context, scope string, recs []dedup.Record) (T, []dedup.Claim, error)
	// CommitChain commits tx and, in the same round trip, begins the next
	// transaction on the same connection and claims recs in it, as Claim
	// would. tx then stands for the next transaction: it is used, committed
	// and rolled back like one from Begin.
	//
	// committed reports whether the commit happened. An error with
	// committed false is what Commit would have returned, and the claim was
	// not made; an error with committed true is the claim's. After an error
	// the caller must Rollback tx. ErrUnsupported (committed false, nothing
	// sent) without Caps.CommitChain.
	CommitChain(ctx context.Context, tx T, scope string, recs []dedup.Record) (claims []dedup.Claim, committed bool, err error)
	// IsAborted reports whether err, returned by a statement inside one of
	// the driver's transactions, says only that the transaction had
	// already failed (PostgreSQL's SQLSTATE 25P02): an earlier message may
	// have swallowed its error, and the Runner looks for the culprit among
	// the messages that ran before. False without Caps.Aborted.
	IsAborted(err error) bool
	// Failed reports, without a round trip, whether tx has failed: a
	// statement in it failed, so it can only roll back (PostgreSQL's
	// transaction status 'E'). The Runner asks after every handler that
	// returned nil. False without Caps.FailedTx.
	Failed(tx T) bool
	// Ended reports, without a round trip, whether tx is no longer open on
	// its connection although the Runner neither committed nor rolled it
	// back: a handler sent COMMIT or ROLLBACK through it (PostgreSQL's
	// transaction status 'I'). A closed connection is not ended. The Runner
	// refuses to commit an ended transaction, blaming that handler. False
	// without Caps.EndedTx.
	Ended(tx T) bool
	// ForgetEnded removes the records of keys (claimed in tx, whose
	// handlers had not run) if a handler's COMMIT made them durable: only
	// those written by the same transaction as the record of culprit, the
	// handler's own key. ErrUnsupported without Caps.EndedTx.
	ForgetEnded(ctx context.Context, tx T, scope, culprit string, keys []string) error
	// IsTransient reports whether err, returned by a handler inside one of
	// the driver's transactions, is a typed driver error for a transient
	// database condition (a deadlock, a serialization failure, a lost
	// connection, a server shutting down) that says nothing about the
	// message. Errors the driver did not produce (a context deadline, a
	// decoder's io.ErrUnexpectedEOF) are not transient. False without
	// Caps.Transient.
	IsTransient(err error) bool
	// PoolSize returns the most connections the pool the transactions draw
	// on opens, or 0 when there is no limit or the driver cannot tell. The
	// Runner holds one connection per concurrent batch for the whole
	// transaction, so consumer.NewRunner refuses a pool no larger than
	// Config.Concurrency. 0 without Caps.Pool.
	PoolSize() int
	// StoreResults writes each result into the record of its key, claimed
	// as new in tx, so the result commits or rolls back with the record and
	// the handler's writes. ErrUnsupported without Caps.Results.
	StoreResults(ctx context.Context, tx T, scope string, results []dedup.Result) error
}

// Lease is the driver of the lease path, for effects that cannot join a
// database transaction (emails, webhooks, third-party APIs). Every state
// change after Claim is guarded by the token the claim was made with, so a
// worker whose lease expired can neither extend it, mark it done nor abandon
// it once another worker owns the key.
//
// Implementations must be safe for concurrent use.
type Lease interface {
	Common

	// Claim takes the lease on key for the given duration if nobody holds
	// it and it is not done. It returns dedup.StateNew when the caller now
	// holds the lease, StateDone or StateMismatch when the key was
	// completed before, and StateInProgress when another token holds a live
	// lease (a driver that keeps the payload digest of a live lease may
	// report StateMismatch for a different payload instead). Claiming again
	// with the token that holds the key returns StateNew again.
	Claim(ctx context.Context, scope string, rec dedup.Record, token string, lease time.Duration) (dedup.Claim, error)
	// Refresh extends a lease held by token. It returns dedup.ErrLeaseLost
	// when token no longer holds the key.
	Refresh(ctx context.Context, scope, key, token string, lease time.Duration) error
	// Complete marks key done under token, keeping the record for
	// retention. It returns dedup.ErrLeaseLost when token no longer holds
	// the key; the caller must then treat the outcome as unknown.
	// Completing again with the same token succeeds.
	Complete(ctx context.Context, scope, key, token string, retention time.Duration) error
	// Abandon drops the lease held by token after a failed effect, so that
	// a retry may claim the key at once. Abandoning a lease that token no
	// longer holds is not an error and changes nothing.
	Abandon(ctx context.Context, scope, key, token string) error
	// Inspect returns what the store holds for key, or dedup.ErrNotFound.
	Inspect(ctx context.Context, scope, key string) (dedup.Entry, error)

	// ClaimBatch claims several keys in one round trip, each exactly as
	// Claim would with tokens[i], and returns the claims in the order of
	// recs. After an error some keys may be claimed: claiming them again
	// with the same tokens is safe. ErrUnsupported without
	// Caps.BatchClaim.
	ClaimBatch(ctx context.Context, scope string, recs []dedup.Record, tokens []string, lease time.Duration) ([]dedup.Claim, error)
	// CompleteWithResult is Complete that also stores result with the
	// record, for Claim to return in Claim.Result to later deliveries.
	// ErrUnsupported without Caps.Results; dedup.ErrResultTooLarge when the
	// driver refuses the result's size (nothing is stored by the call).
	CompleteWithResult(ctx context.Context, scope, key, token string, retention time.Duration, result []byte) error
}
