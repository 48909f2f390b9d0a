package consumertest

import "github.com/idemq/idemq/internal/faults"

// FaultKind names how a scripted message is delivered (Delivery.Fault). It
// is the one vocabulary of injected failures that every in-memory kit speaks
// (consumertest, consumer/memsource, dedup/memdedup): an alias, so a kind
// from one kit is a kind of every other, under the same name in each.
type FaultKind = faults.Kind

// The kinds a Delivery accepts (Replay fails t on any other). Each has the
// same name in every in-memory kit that accepts it.
const (
	// None delivers the message once. The zero value.
	None = faults.None
	// Redelivered delivers the message a second time while the first
	// delivery is still being handled by the same worker.
	Redelivered = faults.Redelivered
	// ConcurrentDuplicate delivers the message to two workers at the same
	// moment.
	ConcurrentDuplicate = faults.ConcurrentDuplicate
	// CrashAfterCommit loses the acknowledgement after the handler's
	// transaction committed, so that the message is delivered again.
	CrashAfterCommit = faults.CrashAfterCommit
	// ProducerDuplicate publishes the message twice.
	ProducerDuplicate = faults.ProducerDuplicate
)
