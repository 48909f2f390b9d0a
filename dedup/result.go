package dedup

import (
	"context"
	"errors"
	"time"
)

// Result is the outcome a handler returned for one key, stored with the
// key's record so that a later delivery of the key (a redelivery, a retried
// request) gets the original answer instead of running the effect again.
// It lives and expires with the record (the store's retention).
type Result struct {
	Key   string
	Value []byte
}

// ResultStorer is an optional interface of a TxStore: the stores that keep a
// result with a record (pgdedup and sqldedup do). StoreResults writes each
// result into the record of its key, claimed as new in tx by Claim (or
// BeginClaim, CommitChain), so the result commits or rolls back with the
// record and the handler's writes. Records without a result are not
// touched and stay as small as before; a Claim that finds a done record
// returns its result in Claim.Result, without an extra round trip.
type ResultStorer[Tx any] interface {
	StoreResults(ctx context.Context, tx Tx, scope string, results []Result) error
}

// ResultCompleter is an optional interface of a LeaseStore: the stores that
// keep a result next to the done key (redisdedup does). CompleteWithResult
// is Complete that also stores result with the record, for Claim to return
// in Claim.Result to later deliveries of the key.
type ResultCompleter interface {
	CompleteWithResult(ctx context.Context, scope, key, token string, retention time.Duration, result []byte) error
}

// ErrResultTooLarge is matched by the error of a store (or of the runner)
// refusing a result above its size limit. Nothing is stored for the key by
// the call that failed.
var ErrResultTooLarge = errors.New("dedup: result too large")
