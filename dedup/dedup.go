package dedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// DefaultRetention is how long a processed record is kept when a store's
// configuration does not say otherwise: 8 days. Redeliveries and producer
// retries arriving later than this are no longer recognised, so it is chosen
// above the brokers' default message retention (Kafka topics 7 days, SQS
// queues 4 days), which bounds how late a redelivery can come; the Runner
// refuses to start when the source reports a longer horizon (see
// consumer.HorizonReporter). The cost is storage: one record per processed
// message for 8 days (docs/performance.md has the size of a record).
const DefaultRetention = 8 * 24 * time.Hour

// Hash is the SHA-256 digest of a message payload. Records store it so that
// the same key arriving with a different payload is reported instead of being
// silently treated as a duplicate.
type Hash [sha256.Size]byte

// HashPayload returns the SHA-256 digest of body.
func HashPayload(body []byte) Hash { return sha256.Sum256(body) }

// String returns the digest as lowercase hex.
func (h Hash) String() string {
	var b [2 * len(Hash{})]byte // on the stack: one allocation, the string's
	hex.Encode(b[:], h[:])
	return string(b[:])
}

// Short returns the first 12 hex digits of the digest, for logs.
func (h Hash) Short() string { return hex.EncodeToString(h[:6]) }

// IsZero reports whether h is the zero value (no digest).
func (h Hash) IsZero() bool { return h == Hash{} }

// HashFromBytes converts a stored digest back into a Hash. It fails unless b
// is exactly sha256.Size bytes long.
func HashFromBytes(b []byte) (Hash, error) {
	var h Hash
	if len(b) != len(h) {
		return h, fmt.Errorf("dedup: stored payload hash has %d bytes, want %d", len(b), len(h))
	}
	copy(h[:], b)
	return h, nil
}

// Record is one message to be claimed: its deduplication key and the digest
// of its payload.
type Record struct {
	Key         string
	PayloadHash Hash
}

// State is the outcome of a claim.
type State int

const (
	// StateNew means the caller now owns the key: the effect has not happened
	// and the caller must perform it (and record it, or release the claim).
	StateNew State = iota + 1
	// StateDone means the key was processed before with the same payload:
	// the message is a duplicate and can be acknowledged without running
	// the effect.
	StateDone
	// StateMismatch means the key was processed before with a different
	// payload. It is an error, never a duplicate: see ErrPayloadMismatch.
	StateMismatch
	// StateInProgress means another worker holds a live lease on the key
	// (lease path only). The caller must neither run the effect nor
	// acknowledge the message; it retries later.
	StateInProgress
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case StateNew:
		return "new"
	case StateDone:
		return "done"
	case StateMismatch:
		return "mismatch"
	case StateInProgress:
		return "in-progress"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Claim is the answer of a store for one key.
type Claim struct {
	Key   string
	State State
	// StoredHash is the payload digest already recorded for the key. It is
	// set for StateDone, StateMismatch and, where the store knows it,
	// StateInProgress.
	StoredHash Hash
	// ProcessedAt is when the stored record was written (zero for StateNew).
	ProcessedAt time.Time
	// Result is the result stored with the record (StateDone only; see
	// ResultStorer and ResultCompleter), nil when it has none.
	Result []byte
}

// Entry is what a store holds for one key, as returned by Inspect methods.
type Entry struct {
	Scope       string
	Key         string
	PayloadHash Hash
	ProcessedAt time.Time
	ExpiresAt   time.Time
	// InProgress is true while a lease is held and the effect is not marked done.
	InProgress bool
	// LeaseUntil is when the current lease expires (lease path only).
	LeaseUntil time.Time
	// Result is the result stored with the record, nil when it has none.
	Result []byte
}

// ErrPayloadMismatch reports a key that was already processed with a
// different payload. Match it with errors.Is; the concrete error is a
// *MismatchError carrying both digests.
var ErrPayloadMismatch = errors.New("dedup: same key processed before with a different payload")

// ErrLeaseLost reports that a lease operation was refused because the caller's
// token no longer owns the key: the lease expired and another worker claimed
// it, or it was released. The caller must stop and must not mark the effect
// done.
var ErrLeaseLost = errors.New("dedup: lease lost")

// ErrNotFound is returned by Inspect methods when no record exists for a key.
var ErrNotFound = errors.New("dedup: no record for key")

// MismatchError is the error for StateMismatch. It matches ErrPayloadMismatch.
type MismatchError struct {
	Scope    string
	Key      string
	Stored   Hash
	Received Hash
}

// Error implements error.
func (e *MismatchError) Error() string {
	return fmt.Sprintf("dedup: key %q in scope %q was processed with payload %s, received payload %s",
		e.Key, e.Scope, e.Stored.Short(), e.Received.Short())
}

// Is makes errors.Is(err, ErrPayloadMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrPayloadMismatch }

// TxStore is the database side of the transactional path: it records
// processed keys inside the same transaction as the handler's own writes.
// Tx is the transaction type handlers receive (pgx.Tx for pgdedup, *sql.Tx
// for sqldedup).
//
// The runner drives one transaction per batch, with no savepoint per
// message (a writing savepoint costs a subtransaction XID per message, and
// more than 64 in one transaction overflow PostgreSQL's subtransaction
// cache):
//
//	Begin → Claim(all keys) → the handlers of the new keys → Commit
//
// When a handler fails, the runner rolls the whole transaction back (the
// failed message's record and writes with it) and runs the batch again
// without the culprit, so a store needs no way to undo part of a
// transaction.
//
// Implementations must be safe for concurrent use by multiple goroutines;
// each transaction is used by one goroutine at a time.
type TxStore[Tx any] interface {
	// Begin starts a transaction.
	Begin(ctx context.Context) (Tx, error)
	// Commit commits tx. An error means the commit did not happen or its
	// outcome is unknown: the caller must not acknowledge anything recorded
	// in tx. An error matching ErrTxRefused says the outcome is known
	// (nothing committed) and the transaction's own content is at fault.
	Commit(ctx context.Context, tx Tx) error
	// Rollback rolls tx back. It is safe to call after Commit.
	Rollback(ctx context.Context, tx Tx) error
	// Claim records recs in tx under scope and reports, in the order of recs,
	// whether each key is new, already done or a payload mismatch. Keys are
	// locked in ascending key order, so concurrent batches cannot deadlock on
	// them. If another transaction holds an uncommitted claim on a key, Claim
	// waits for it to finish: a commit makes the key StateDone (or
	// StateMismatch), a rollback makes it StateNew for this caller. recs must
	// not contain a key twice.
	Claim(ctx context.Context, tx Tx, scope string, recs []Record) ([]Claim, error)
}

// BeginClaimer is an optional interface of a TxStore. BeginClaim is Begin
// followed by Claim, sent in one round trip where the driver can pipeline
// them. On an error no transaction is left open.
type BeginClaimer[Tx any] interface {
	BeginClaim(ctx context.Context, scope string, recs []Record) (Tx, []Claim, error)
}

// CommitChainer is an optional interface of a TxStore. CommitChain commits
// tx and, in the same round trip where the driver can pipeline them, begins
// the next transaction on the same connection and claims recs in it, as
// Claim would (PostgreSQL's COMMIT AND CHAIN). tx then stands for the next
// transaction: it is used, committed and rolled back like one from Begin.
//
// committed reports whether the commit happened. An error with committed
// false is what Commit would have returned, and the claim was not made; an
// error with committed true is the claim's. After an error the caller must
// Rollback tx, which ends whatever the connection still holds.
type CommitChainer[Tx any] interface {
	CommitChain(ctx context.Context, tx Tx, scope string, recs []Record) (claims []Claim, committed bool, err error)
}

// ErrTxRefused is matched by the error of a TxStore's Commit when the
// database refused the commit because of the transaction's own content: a
// statement in it had failed (and an error was swallowed), or a deferred
// constraint failed. Nothing was committed. Any other commit error leaves the
// outcome unknown and says nothing about the messages.
var ErrTxRefused = errors.New("dedup: commit refused")

// AbortClassifier is an optional interface of a TxStore. IsAborted reports
// whether err, returned by a statement inside one of the store's
// transactions, says only that the transaction had already failed
// (PostgreSQL's SQLSTATE 25P02, "current transaction is aborted"): the
// message whose statement got it is not necessarily the one that failed, an
// earlier one may have swallowed its error. The runner then looks for the
// culprit among the messages that ran before, without counting an attempt
// against the others.
type AbortClassifier interface {
	IsAborted(err error) bool
}

// FailedTxReporter is an optional interface of a TxStore. Failed reports,
// without a round trip, whether tx has failed: a statement in it failed, so
// it can only roll back (PostgreSQL's transaction status 'E'). The runner
// asks after every handler that returned nil, so that a handler that
// swallowed its statement's error is blamed at once instead of being
// searched for.
type FailedTxReporter[Tx any] interface {
	Failed(tx Tx) bool
}

// EndedTxReporter is an optional interface of a TxStore. Ended reports,
// without a round trip, whether tx is no longer open on its connection
// although the runner neither committed nor rolled it back: a handler sent
// COMMIT or ROLLBACK through it, so the statements that follow would run in
// autocommit (PostgreSQL's transaction status 'I'). A closed connection is
// not ended: its commit fails. The runner asks after every handler and
// refuses to commit an ended transaction, blaming that handler.
//
// ForgetEnded then removes the records of keys (claimed in tx, whose
// handlers had not run) if the handler's COMMIT made them durable: only
// those written by the same transaction as the record of culprit, the
// handler's own key. After a ROLLBACK they are gone already, and a record
// another worker wrote since is left alone.
type EndedTxReporter[Tx any] interface {
	Ended(tx Tx) bool
	ForgetEnded(ctx context.Context, tx Tx, scope, culprit string, keys []string) error
}

// TransientClassifier is an optional interface of a TxStore. IsTransient
// reports whether err, returned by a handler inside one of the store's
// transactions, is a typed driver error for a transient database condition
// (a deadlock, a serialization failure, a lost connection, a server shutting
// down) that says nothing about the message. The runner retries such
// failures without counting them against the retry policy's attempt limit,
// so a busy database never dead-letters good messages. Errors the driver did
// not produce (a context deadline, a failed HTTP call, a decoder's
// io.ErrUnexpectedEOF) must not be reported as transient: they are the
// handler's own, counted attempts.
type TransientClassifier interface {
	IsTransient(err error) bool
}

// BatchClaimer is an optional interface of a LeaseStore. ClaimBatch claims
// several keys in one round trip, each exactly as Claim would with
// tokens[i], and returns the claims in the order of recs. After an error some
// keys may be claimed: claiming them again with the same tokens is safe. The
// lease path uses it for batches of more than one message.
type BatchClaimer interface {
	ClaimBatch(ctx context.Context, scope string, recs []Record, tokens []string, lease time.Duration) ([]Claim, error)
}

// LeaseStore is the store of the lease path, for effects that cannot join a
// database transaction (emails, webhooks, third-party APIs). Every state
// change after Claim is guarded by the token the claim was made with, so a
// worker whose lease expired can neither extend it, mark it done nor abandon
// it once another worker owns the key.
//
// Implementations must be safe for concurrent use.
type LeaseStore interface {
	// Claim takes the lease on key for the given duration if nobody holds
	// it and it is not done. It returns StateNew when the caller now holds
	// the lease, StateDone or StateMismatch when the key was completed
	// before, and StateInProgress when another token holds a live lease
	// (a store that keeps the payload digest of a live lease may report
	// StateMismatch for a different payload instead). Claiming again with
	// the token that holds the key returns StateNew again, so a client that
	// resends a command whose reply was lost is safe.
	Claim(ctx context.Context, scope string, rec Record, token string, lease time.Duration) (Claim, error)
	// Refresh extends a lease held by token. It returns ErrLeaseLost when
	// token no longer holds the key.
	Refresh(ctx context.Context, scope, key, token string, lease time.Duration) error
	// Complete marks key done under token, keeping the record for retention.
	// It returns ErrLeaseLost when token no longer holds the key; the caller
	// must then treat the outcome as unknown. Completing again with the same
	// token succeeds.
	Complete(ctx context.Context, scope, key, token string, retention time.Duration) error
	// Abandon drops the lease held by token after a failed effect, so that a
	// retry may claim the key at once. Abandoning a lease that token no longer
	// holds is not an error and changes nothing.
	Abandon(ctx context.Context, scope, key, token string) error
	// Inspect returns what the store holds for key, or ErrNotFound.
	Inspect(ctx context.Context, scope, key string) (Entry, error)
}
