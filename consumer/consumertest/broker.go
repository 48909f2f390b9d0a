package consumertest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer"
)

// DeadLetter is a message that a replay routed to the dead-letter
// destination.
type DeadLetter struct {
	// ID is the broker's id of the delivery's message.
	ID string
	// Key, Body, Headers and PartitionKey are the scripted message's.
	Key          string
	Body         []byte
	Headers      map[string]string
	PartitionKey string
	// Reason is the text of Err.
	Reason string
	// Err is the error the runner dead-lettered the message with.
	Err error
	// Attempts is the Attempt of the delivery that was dead-lettered.
	Attempts int
	// At is when the dead letter was recorded.
	At time.Time
}

// errExpired is returned when a settled delivery's visibility timeout had
// passed: the message is (or will be) delivered again.
var errExpired = errors.New("consumertest: delivery expired")

// broker is the replay's in-memory broker: one queue, delivered to several
// sources (one per runner) at least once, with the faults of the script. A
// delivery that is not settled within vis is delivered again; the messages
// of one partition key are delivered one at a time, in publish order, as a
// real broker orders a partition. It keeps to what a replay needs; see
// sources/memsource for a scriptable broker with every fault.
type broker struct {
	vis time.Duration

	mu         sync.Mutex
	queue      []*scripted
	dead       []DeadLetter
	sources    []*source
	deliveries uint64
	nextID     uint64
	nextDeliv  uint64
	changed    chan struct{}
}

// scripted is one published message.
type scripted struct {
	id          string
	d           Delivery
	deliveries  int
	live        map[uint64]*delivery // outstanding deliveries by number
	availableAt time.Time            // not deliverable before (Retry delay)
	extra       []*source            // owed copies; nil: any source, else any source but this one
	duplicate   bool                 // the first delivery owes a copy to any source
	concurrent  bool                 // the first delivery owes a copy to another source
	dropAck     bool                 // the first Ack is lost
	done        bool                 // acknowledged or dead-lettered
}

// delivery is one delivery of a message to a source: the Message's Handle.
type delivery struct {
	n        uint64
	m        *scripted
	src      *source
	attempt  int
	deadline time.Time
}

// source is one runner's consumer.Source over the broker.
type source struct {
	b      *broker
	done   chan struct{}
	closed bool
}

func newBroker(vis time.Duration) *broker {
	return &broker{vis: vis, changed: make(chan struct{})}
}

// wake tells waiting receivers that something changed. b.mu is held.
func (b *broker) wake() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// publish queues d with its fault.
func (b *broker) publish(d Delivery) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nextID++
	m := &scripted{id: fmt.Sprintf("replay-%d", b.nextID), d: d, live: map[uint64]*delivery{}}
	m.d.Headers = maps.Clone(d.Headers)
	m.d.Body = append([]byte(nil), d.Body...)
	switch d.Fault {
	case Redelivered:
		m.duplicate = true
	case ConcurrentDuplicate:
		m.concurrent = true
	case CrashAfterCommit:
		m.dropAck = true
	}
	b.queue = append(b.queue, m)
	b.wake()
}

// source returns a new Source for one runner.
func (b *broker) source() *source {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := &source{b: b, done: make(chan struct{})}
	b.sources = append(b.sources, s)
	return s
}

// pending counts the messages neither acknowledged nor dead-lettered: those
// ready to be delivered and those in flight.
func (b *broker) pending() (ready, inFlight int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.queue {
		switch {
		case m.done:
		case len(m.live) > 0:
			inFlight++
		default:
			ready++
		}
	}
	return ready, inFlight
}

// deliveryCount returns the number of deliveries made, redeliveries included.
func (b *broker) deliveryCount() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.deliveries
}

// deadLetters returns the dead letters recorded so far.
func (b *broker) deadLetters() []DeadLetter {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]DeadLetter(nil), b.dead...)
}

// close closes every source.
func (b *broker) close() {
	b.mu.Lock()
	srcs := b.sources
	b.mu.Unlock()
	for _, s := range srcs {
		_ = s.Close()
	}
}

// Receive blocks until a message is deliverable, then returns up to max.
func (s *source) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	b := s.b
	for {
		b.mu.Lock()
		if s.closed {
			b.mu.Unlock()
			return nil, consumer.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			b.mu.Unlock()
			return nil, err
		}
		now := time.Now()
		msgs, wake := s.take(now, max)
		changed := b.changed
		b.mu.Unlock()
		if len(msgs) > 0 {
			return msgs, nil
		}
		var timer *time.Timer
		var fired <-chan time.Time
		if !wake.IsZero() {
			timer = time.NewTimer(wake.Sub(now))
			fired = timer.C
		}
		select {
		case <-ctx.Done():
		case <-s.done:
		case <-changed:
		case <-fired:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// take delivers up to max messages to s, and returns them and the earliest
// instant at which a delivery may expire or a delayed message become ready
// (zero if none). b.mu is held.
func (s *source) take(now time.Time, max int) ([]*consumer.Message, time.Time) {
	b := s.b
	var (
		out     []*consumer.Message
		wake    time.Time
		blocked = map[string]bool{} // partition keys whose next message must wait
	)
	later := func(at time.Time) {
		if wake.IsZero() || at.Before(wake) {
			wake = at
		}
	}
	block := func(pk string) {
		if pk != "" {
			blocked[pk] = true
		}
	}
	deliver := func(m *scripted) {
		m.deliveries++
		b.nextDeliv++
		b.deliveries++
		d := &delivery{n: b.nextDeliv, m: m, src: s, attempt: m.deliveries, deadline: now.Add(b.vis)}
		m.live[d.n] = d
		later(d.deadline)
		out = append(out, &consumer.Message{
			ID:           m.id,
			Key:          m.d.Key,
			Body:         append([]byte(nil), m.d.Body...),
			Headers:      maps.Clone(m.d.Headers),
			PartitionKey: m.d.PartitionKey,
			Topic:        topic,
			Attempt:      d.attempt,
			Redelivered:  d.attempt > 1,
			ReceivedAt:   now,
			Handle:       d,
		})
	}
	owed := func(m *scripted) {
		for i := 0; i < len(m.extra) && len(out) < max; {
			if m.extra[i] == s {
				i++
				continue
			}
			m.extra = append(m.extra[:i], m.extra[i+1:]...)
			deliver(m)
		}
	}
	for _, m := range b.queue {
		if len(out) >= max {
			break
		}
		if m.done {
			continue
		}
		pk := m.d.PartitionKey
		for n, d := range m.live {
			if now.Before(d.deadline) {
				later(d.deadline)
				continue
			}
			delete(m.live, n)
		}
		if len(m.live) > 0 {
			for _, d := range m.live {
				if d.src != s {
					block(pk)
				}
			}
			owed(m)
			continue
		}
		if blocked[pk] {
			continue
		}
		if now.Before(m.availableAt) {
			later(m.availableAt)
			block(pk)
			continue
		}
		deliver(m)
		if m.duplicate {
			m.duplicate = false
			m.extra = append(m.extra, nil)
		}
		if m.concurrent {
			m.concurrent = false
			m.extra = append(m.extra, s)
		}
		owed(m)
	}
	return out, wake
}

// current returns the delivery of msg if it still counts (nil when the
// message is settled already), expiring it if its visibility timeout
// passed. b.mu is held.
func (s *source) current(msg *consumer.Message, now time.Time) (*delivery, error) {
	d, ok := msg.Handle.(*delivery)
	if !ok || d == nil || d.src != s {
		return nil, fmt.Errorf("consumertest: message %q was not received by this source", msg.ID)
	}
	switch {
	case s.closed:
		return nil, consumer.ErrClosed
	case d.m.done:
		return nil, nil
	case d.m.live[d.n] != d:
		return nil, fmt.Errorf("message %q attempt %d: %w", d.m.id, d.attempt, errExpired)
	case !now.Before(d.deadline):
		delete(d.m.live, d.n)
		s.b.wake()
		return nil, fmt.Errorf("message %q attempt %d: %w", d.m.id, d.attempt, errExpired)
	}
	return d, nil
}

// settle marks m acknowledged or dead-lettered. b.mu is held.
func (b *broker) settle(m *scripted) {
	m.done = true
	clear(m.live)
	m.extra = nil
	b.wake()
}

// Ack acknowledges msgs; a CrashAfterCommit message's first Ack is lost.
func (s *source) Ack(_ context.Context, msgs []*consumer.Message) error {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	now := time.Now()
	for _, msg := range msgs {
		d, err := s.current(msg, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if d == nil {
			continue
		}
		if d.m.dropAck {
			d.m.dropAck = false
			continue
		}
		b.settle(d.m)
	}
	return errors.Join(errs...)
}

// Retry hands msg back: it is delivered again, with Attempt increased, no
// sooner than delay from now.
func (s *source) Retry(_ context.Context, msg *consumer.Message, delay time.Duration) error {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	d, err := s.current(msg, now)
	if err != nil || d == nil {
		return err
	}
	delete(d.m.live, d.n)
	d.m.availableAt = now.Add(max(delay, 0))
	b.wake()
	return nil
}

// DeadLetter records msg with reason in the broker's dead letters and
// removes it from the queue.
func (s *source) DeadLetter(_ context.Context, msg *consumer.Message, reason error) error {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	d, err := s.current(msg, now)
	if err != nil || d == nil {
		return err
	}
	if reason == nil {
		reason = errors.New("consumertest: dead-lettered without a reason")
	}
	m := d.m
	b.dead = append(b.dead, DeadLetter{
		ID: m.id, Key: m.d.Key, Body: m.d.Body, Headers: maps.Clone(m.d.Headers), PartitionKey: m.d.PartitionKey,
		Reason: reason.Error(), Err: reason, Attempts: d.attempt, At: now,
	})
	b.settle(m)
	return nil
}

// Close returns the source's unsettled messages to the queue at once; later
// calls fail with consumer.ErrClosed.
func (s *source) Close() error {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.done)
	for _, m := range b.queue {
		for n, d := range m.live {
			if d.src == s {
				delete(m.live, n)
			}
		}
	}
	b.wake()
	return nil
}
