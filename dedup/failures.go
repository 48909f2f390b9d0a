package dedup

import "context"

// FailureCounter is an optional interface of a TxStore or a LeaseStore: it
// counts the handler failures of each key, so that a retry policy's attempt
// limit counts failures of the message rather than deliveries of it. Broker
// delivery counts (SQS ApproximateReceiveCount, a quorum queue's
// x-delivery-count) also rise for every consumer that crashed or was killed
// while holding the message, which is not the message's fault.
//
// The runner calls RecordFailure only after a handler failed, outside the
// transaction that rolled the failure back (its own short statement or
// Redis call), so counting costs nothing on the happy path. A count is never
// reset on success: once a key is recorded as processed its deliveries are
// duplicates, and the handler does not run again. A count expires with the
// store's retention after its last failure; the store's janitor deletes it.
//
// Implementations must be safe for concurrent use; concurrent calls for one
// key each return a distinct count.
type FailureCounter interface {
	// RecordFailure adds one handler failure to key in scope and returns the
	// number of failures recorded for it, this one included (1 for the first
	// failure, or the first after the count expired).
	RecordFailure(ctx context.Context, scope, key string) (failures int, err error)
}
