package faults

import "fmt"

// Kind names an injected failure: how a broker delivers a message, or which
// operation of a broker or a store fails. It is the one vocabulary of the
// in-memory kits: consumertest.Delivery.Fault, memsource.Fault.Kind and
// memdedup.Fault.Kind. Each kit re-exports it as the alias FaultKind, with
// the kinds it accepts as constants of the same names.
type Kind int

// Kinds of injected failure.
const (
	// None injects nothing: the message is delivered once, the operation
	// succeeds. The zero value.
	None Kind = iota
	// Redelivered delivers a message a second time while the first
	// delivery is still in flight at the same consumer, as a broker does
	// after a lost ack or an expired lease (Attempt increased, Redelivered
	// set).
	Redelivered
	// ConcurrentDuplicate delivers a message to a second consumer while
	// the first delivery is still in flight, as after a consumer-group
	// rebalance or an expired visibility timeout.
	ConcurrentDuplicate
	// CrashAfterCommit loses the acknowledgement of a message whose
	// handler's transaction committed, as when a worker crashes between
	// commit and ack: Ack reports success, and the broker delivers the
	// message again.
	CrashAfterCommit
	// ProducerDuplicate publishes a message twice, as a producer that
	// retries a send.
	ProducerDuplicate
	// ReceiveError fails a broker's Receive: the broker is unreachable.
	ReceiveError
	// AckError fails the Ack of a message; it stays in flight.
	AckError
	// RetryError fails the Retry of a message; it stays in flight.
	RetryError
	// DeadLetterError fails the DeadLetter of a message; it stays in
	// flight.
	DeadLetterError
	// BeginError fails a store's Begin.
	BeginError
	// ClaimError fails a store's Claim before it claims anything.
	ClaimError
	// CommitError fails a store transaction's Commit.
	CommitError
	// RecordFailureError fails a store's RecordFailure (the failure is not
	// counted).
	RecordFailureError
)

var kindNames = [...]string{
	None:                "none",
	Redelivered:         "redelivered",
	ConcurrentDuplicate: "concurrent-duplicate",
	CrashAfterCommit:    "crash-after-commit",
	ProducerDuplicate:   "producer-duplicate",
	ReceiveError:        "receive-error",
	AckError:            "ack-error",
	RetryError:          "retry-error",
	DeadLetterError:     "dead-letter-error",
	BeginError:          "begin-error",
	ClaimError:          "claim-error",
	CommitError:         "commit-error",
	RecordFailureError:  "record-failure-error",
}

// String returns the kind's name, such as "crash-after-commit".
func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("faults.Kind(%d)", int(k))
}
