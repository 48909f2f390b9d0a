package dedup

import "context"

// FailureCounter is an optional interface of a TxStore or a LeaseStore: it
// counts the handler failures of each message, so that a retry policy's
// attempt limit counts failures of the message rather than deliveries of it.
// Broker delivery counts (SQS ApproximateReceiveCount, a quorum queue's
// x-delivery-count) also rise for every consumer that crashed or was killed
// while holding the message, which is not the message's fault.
//
// A count belongs to a key and the payload digest it failed with: a failure
// with another payload under the same key (a producer that sent a corrected
// message) starts the count again at 1.
//
// The runner calls RecordFailure only after a handler failed, outside the
// transaction that rolled the failure back (its own short statement or
// Redis call), so counting costs nothing on the happy path. A count is not
// reset on success: once a key is recorded as processed its deliveries are
// duplicates, and the handler does not run again. The runner calls
// ForgetFailures after it dead-lettered a message for exhausting its
// attempts, so that a replay of the dead letter starts with a fresh count. A
// count expires with the store's retention after its last failure; the
// store's janitor deletes it.
//
// Implementations must be safe for concurrent use; concurrent calls for one
// key and payload each return a distinct count.
type FailureCounter interface {
	// RecordFailure adds one handler failure to rec.Key in scope and returns
	// the number of failures recorded for it, this one included: 1 for the
	// first failure, the first after the count expired or was forgotten, or
	// the first with a payload digest other than the one counted so far.
	RecordFailure(ctx context.Context, scope string, rec Record) (failures int, err error)
	// ForgetFailures deletes the failure count of key in scope. Forgetting a
	// key without a count is not an error.
	ForgetFailures(ctx context.Context, scope, key string) error
}
