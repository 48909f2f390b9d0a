package sqssource

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors of the package. Match them with errors.Is.
var (
	// ErrNoDeadLetterRoute is returned by New when Config.DeadLetterQueueURL
	// is empty and the queue has no redrive policy either: poison messages
	// would have nowhere to go and would be received for ever.
	ErrNoDeadLetterRoute = errors.New("sqssource: no dead-letter route: set Config.DeadLetterQueueURL or give the queue a redrive policy")

	// ErrForeignMessage is returned by Ack, Retry and DeadLetter for a
	// message that this Source did not receive.
	ErrForeignMessage = errors.New("sqssource: message was not received by this source")
)

// EntryError is one entry that SQS refused in a batch call.
type EntryError struct {
	// MessageID is the MessageId of the message the entry was for.
	MessageID string
	// Code is the SQS error code, for example "ReceiptHandleIsInvalid".
	Code string
	// Message is SQS's explanation.
	Message string
	// SenderFault reports that SQS blames the request, so sending it again
	// cannot succeed.
	SenderFault bool
}

// BatchError reports the entries of a DeleteMessageBatch or
// ChangeMessageVisibilityBatch call that failed even after retries. The other
// entries of the batch succeeded.
type BatchError struct {
	// Op is the SQS operation, for example "DeleteMessageBatch".
	Op string
	// Entries are the failed entries.
	Entries []EntryError
	// Err is the last request-level error, if the request itself failed.
	Err error
}

// Error implements error.
func (e *BatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sqssource: %s: %d entries failed", e.Op, len(e.Entries))
	for i, en := range e.Entries {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more", len(e.Entries)-i)
			break
		}
		fmt.Fprintf(&b, "; %s: %s: %s", en.MessageID, en.Code, en.Message)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Unwrap returns the request-level error, if any.
func (e *BatchError) Unwrap() error { return e.Err }
