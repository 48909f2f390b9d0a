package dedup

import (
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
	// dedupdriver.Caps.Results), nil when it has none.
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

// ErrTxRefused is matched by the error of a transactional driver's Commit
// (dedupdriver.Tx) when the database refused the commit because of the
// transaction's own content: a statement in it had failed (and an error was
// swallowed), or a deferred constraint failed. Nothing was committed. Any other commit error leaves the
// outcome unknown and says nothing about the messages.
var ErrTxRefused = errors.New("dedup: commit refused")

// Result is the outcome a handler returned for one key, stored with the
// key's record so that a later delivery of the key (a redelivery, a retried
// request) gets the original answer instead of running the effect again.
// It lives and expires with the record (the store's retention).
type Result struct {
	Key   string
	Value []byte
}

// ErrResultTooLarge is matched by the error of a store (or of the runner)
// refusing a result above its size limit. Nothing is stored for the key by
// the call that failed.
var ErrResultTooLarge = errors.New("dedup: result too large")

// Durability is what a store read of its server's persistence settings:
// the answer of its driver's Durability (dedupdriver.Caps.Durability).
type Durability struct {
	// Settings are the settings read, as the server names them, for logs
	// and errors: "appendonly=yes appendfsync=everysec".
	Settings string
	// Loss says how a write the server acknowledged can be lost (by a
	// restart of the server, a crash of it or of its machine), or could be,
	// when a setting that matters could not be read; empty when the
	// settings read rule that out.
	Loss string
}

// ErrNotDurable is matched by the error of a store's Durability (see
// dedupdriver.Caps.Durability) set to refuse
// a server that can lose the writes it acknowledged (see
// redisdedup.Config.RequireDurable). The error is a *idemq.ConfigError
// that states the settings read.
var ErrNotDurable = errors.New("dedup: the store's server can lose acknowledged writes")
