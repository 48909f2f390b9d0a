package memsource

import (
	"context"
	"fmt"
	"slices"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/faults"
)

// FaultKind names an injected failure (Fault.Kind): how the broker delivers
// a message, or which of its operations fails. It is the one vocabulary of
// injected failures that every in-memory kit speaks (consumer/consumertest,
// memsource, dedup/memdedup): an alias, so a kind from one kit is a kind of
// every other, under the same name in each.
type FaultKind = faults.Kind

// The kinds a Broker accepts (see Broker.Inject). Each has the same name in
// every in-memory kit that accepts it.
const (
	// Redelivered delivers a matching message a second time while the
	// first delivery is still in flight.
	Redelivered = faults.Redelivered
	// ConcurrentDuplicate delivers a matching message to a second Source
	// while the first delivery is still in flight.
	ConcurrentDuplicate = faults.ConcurrentDuplicate
	// CrashAfterCommit loses the acknowledgement of a matching message: Ack
	// reports success, and the message comes back.
	CrashAfterCommit = faults.CrashAfterCommit
	// ReceiveError fails Receive: the broker is unreachable.
	ReceiveError = faults.ReceiveError
	// AckError fails the Ack of a matching message; it stays in flight.
	AckError = faults.AckError
	// RetryError fails the Retry of a matching message; it stays in flight.
	RetryError = faults.RetryError
	// DeadLetterError fails the DeadLetter of a matching message; it stays
	// in flight.
	DeadLetterError = faults.DeadLetterError
)

// kinds are the fault kinds a Broker injects (see Broker.Inject).
var kinds = []FaultKind{
	Redelivered, ConcurrentDuplicate, CrashAfterCommit, AckError,
	ReceiveError, RetryError, DeadLetterError,
}

// Fault scripts a failure. A fault applies to the operations of its Kind (one
// of the kinds listed at Broker.Inject) on
// messages matching Topic, Key and ID (empty fields match everything), fires
// with Probability, and stops after firing Times times.
type Fault struct {
	// Kind is the failure, one of the kinds listed at Broker.Inject.
	Kind FaultKind
	// Topic restricts the fault to one topic. Empty matches every topic.
	Topic string
	// Key restricts the fault to messages with this Key. Empty matches
	// every message.
	Key string
	// ID restricts the fault to the message with this ID (as returned by
	// Publish). Empty matches every message.
	ID string
	// Probability is the chance that a matching operation fails, drawn
	// from the broker's RNG (seeded with Config.Seed, so a given sequence
	// of calls fails the same way on every run). Zero means 1: always.
	Probability float64
	// Times is how many times the fault fires. Zero means 1; negative
	// means until ClearFaults.
	Times int
	// Err is the error returned by the failing operation (Ack, Retry,
	// DeadLetter and Receive faults). Defaults to ErrInjected.
	Err error
}

func (f Fault) err() error {
	if f.Err != nil {
		return f.Err
	}
	return ErrInjected
}

// Inject schedules f, whose Kind is one of:
//   - Redelivered: a second delivery of a matching message follows at
//     once, in the same Receive if it has room, else in the next one, while
//     the first is still in flight;
//   - ConcurrentDuplicate: the next Receive of any other Source on
//     the topic gets the message too;
//   - CrashAfterCommit: Ack returns nil without acknowledging the
//     message, which comes back after its visibility timeout;
//   - AckError: Ack returns the fault's error and leaves the message
//     in flight (the other messages of the call are acknowledged);
//   - ReceiveError: Receive fails with the fault's error wrapped
//     together with ErrUnavailable (Key and ID are ignored);
//   - RetryError, DeadLetterError: the operation fails and
//     the message stays in flight.
//
// It panics if f.Kind is another or f.Probability is outside [0, 1]. Safe
// for concurrent use.
func (b *Broker) Inject(f Fault) {
	if !slices.Contains(kinds, f.Kind) {
		panic(fmt.Sprintf("memsource: Inject: fault kind %v is not a broker's", f.Kind))
	}
	if f.Probability < 0 || f.Probability > 1 {
		panic(fmt.Sprintf("memsource: Inject: probability %v outside [0, 1]", f.Probability))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.faults.Add(f, f.Times)
}

// ClearFaults removes every scheduled fault.
func (b *Broker) ClearFaults() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.faults.Clear()
}

// fire returns the first scheduled fault of kind matching topic t and message
// m (nil for receive faults) that fires now, using up one firing, or nil.
// b.mu is held.
func (b *Broker) fire(ctx context.Context, kind FaultKind, t *topic, m *stored) *Fault {
	f, ok := b.faults.Fire(func(f Fault) bool {
		if f.Kind != kind || (f.Topic != "" && f.Topic != t.name) {
			return false
		}
		if m != nil && ((f.Key != "" && f.Key != m.Payload.Key) || (f.ID != "" && f.ID != m.ID)) {
			return false
		}
		return f.Probability == 0 || f.Probability == 1 || b.rng.Float64() < f.Probability
	})
	if !ok {
		return nil
	}
	b.log.DebugContext(ctx, "memsource: injected fault", "fault", f.Kind.String(), consumer.LogKeyQueue, t.name, "message_id", idOf(m))
	return &f
}

func idOf(m *stored) string {
	if m == nil {
		return ""
	}
	return m.ID
}
