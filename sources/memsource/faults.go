package memsource

import (
	"context"
	"fmt"

	"github.com/idemq/idemq/consumer"
)

// FaultKind names a scripted failure.
type FaultKind int

// Fault kinds.
const (
	// FaultDuplicate delivers a matching message twice in a row: a second
	// delivery (Attempt increased, Redelivered set) follows at once, in the
	// same Receive if it has room, else in the next one, while the first is
	// still in flight.
	FaultDuplicate FaultKind = iota + 1
	// FaultConcurrentDuplicate delivers a matching message to a second
	// Source while the first delivery is still in flight: the next Receive
	// of any other Source on the topic gets it too, as after an expired
	// visibility timeout or a consumer-group rebalance.
	FaultConcurrentDuplicate
	// FaultDropAck makes Ack return nil without acknowledging a matching
	// message, as when a worker crashes after its commit and before its
	// ack reached the broker. The message comes back after its visibility
	// timeout.
	FaultDropAck
	// FaultAckError makes Ack fail for a matching message: it returns the
	// fault's error and leaves that message in flight (other messages of
	// the call are acknowledged). The message comes back after its
	// visibility timeout.
	FaultAckError
	// FaultReceiveError makes Receive fail with the fault's error wrapped
	// together with ErrUnavailable: the broker is unreachable. Key and ID
	// are ignored.
	FaultReceiveError
	// FaultRetryError makes Retry fail for a matching message; it stays in
	// flight.
	FaultRetryError
	// FaultDeadLetterError makes DeadLetter fail for a matching message; it
	// stays in flight.
	FaultDeadLetterError
)

// String returns the kind's name.
func (k FaultKind) String() string {
	switch k {
	case FaultDuplicate:
		return "duplicate"
	case FaultConcurrentDuplicate:
		return "concurrent-duplicate"
	case FaultDropAck:
		return "drop-ack"
	case FaultAckError:
		return "ack-error"
	case FaultReceiveError:
		return "receive-error"
	case FaultRetryError:
		return "retry-error"
	case FaultDeadLetterError:
		return "dead-letter-error"
	}
	return fmt.Sprintf("FaultKind(%d)", int(k))
}

// Fault scripts a failure. A fault applies to the operations of its Kind on
// messages matching Topic, Key and ID (empty fields match everything), fires
// with Probability, and stops after firing Times times.
type Fault struct {
	// Kind is the failure.
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

// Inject schedules f. It panics if f.Kind is unknown or f.Probability is
// outside [0, 1]. Safe for concurrent use.
func (b *Broker) Inject(f Fault) {
	if f.Kind < FaultDuplicate || f.Kind > FaultDeadLetterError {
		panic(fmt.Sprintf("memsource: Inject: unknown fault kind %d", int(f.Kind)))
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
