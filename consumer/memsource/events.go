package memsource

import (
	"fmt"
	"time"
)

// EventKind says what an Event reports.
type EventKind int

// Event kinds.
const (
	// EventPublish reports a message published.
	EventPublish EventKind = iota + 1
	// EventReceive reports a delivery: a message handed to a Source.
	EventReceive
	// EventAck reports a message acknowledged: it will not be delivered
	// again.
	EventAck
	// EventAckDropped reports an acknowledgement lost or failed through an
	// injected fault: the message stays in flight and comes back after its
	// visibility timeout.
	EventAckDropped
	// EventRetry reports a message handed back for redelivery after
	// Event.Delay.
	EventRetry
	// EventDeadLetter reports a message moved to the dead-letter list with
	// the reason in Event.Err.
	EventDeadLetter
	// EventExpire reports a delivery whose visibility timeout passed
	// unsettled.
	EventExpire
	// EventReturn reports a message returned for redelivery because its
	// Source closed or the broker restarted.
	EventReturn
	// EventClose reports a Source closed.
	EventClose
	// EventRestart reports a broker restart (see Broker.Restart).
	EventRestart
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case EventPublish:
		return "publish"
	case EventReceive:
		return "receive"
	case EventAck:
		return "ack"
	case EventAckDropped:
		return "ack-dropped"
	case EventRetry:
		return "retry"
	case EventDeadLetter:
		return "dead-letter"
	case EventExpire:
		return "expire"
	case EventReturn:
		return "return"
	case EventClose:
		return "close"
	case EventRestart:
		return "restart"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one step of the broker. Events are numbered in the order the
// steps took effect.
type Event struct {
	// Seq numbers the broker's events from 1.
	Seq uint64
	// Kind says what happened.
	Kind EventKind
	// Topic is the topic concerned ("" for EventRestart).
	Topic string
	// Source is the name of the Source concerned, if any.
	Source string
	// ID and Key identify the message concerned, if any.
	ID  string
	Key string
	// Attempt is the delivery's Attempt, if any.
	Attempt int
	// Delay is the delay of an EventRetry.
	Delay time.Duration
	// Err is the dead-letter reason, or the injected error.
	Err error
	// At is when the step happened.
	At time.Time
}

// event numbers an event. b.mu is held.
func (b *Broker) event(kind EventKind, t *topic, s *Source, m *stored, attempt int, err error) Event {
	b.seq++
	ev := Event{Seq: b.seq, Kind: kind, Attempt: attempt, Err: err, At: time.Now()}
	if t != nil {
		ev.Topic = t.name
	}
	if s != nil {
		ev.Source = s.name
	}
	if m != nil {
		ev.ID, ev.Key = m.ID, m.Payload.Key
	}
	return ev
}

// emit passes events to Config.OnEvent. b.mu is not held.
func (b *Broker) emit(events ...Event) {
	if b.cfg.OnEvent == nil {
		return
	}
	for _, ev := range events {
		b.cfg.OnEvent(ev)
	}
}
