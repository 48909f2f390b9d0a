package dedup

import "errors"

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
