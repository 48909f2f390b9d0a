package consumertest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer"
)

// DeadLetter is a message the runners dead-lettered during a replay.
type DeadLetter struct {
	// ID, Key, Body, Headers and PartitionKey are the message's.
	ID           string
	Key          string
	Body         []byte
	Headers      map[string]string
	PartitionKey string
	// Reason is Err.Error(); Err is the reason passed to DeadLetter.
	Reason string
	Err    error
	// Attempts is the Attempt of the delivery that was dead-lettered.
	Attempts int
	// At is when the message was dead-lettered.
	At time.Time
}

// errExpired is returned when a delivery is settled after its visibility
// timeout: the message has gone or will go to another delivery.
var errExpired = errors.New("consumertest: delivery expired")

// broker is the replay's at-least-once queue: a message not settled within
// the visibility timeout is delivered again, messages of one partition key
// go out one at a time in order, and each message carries its scripted fault
// (a second delivery at once, a concurrent delivery to another source, or a
// lost first acknowledgement).
type broker struct {
	vis time.Duration

	mu         sync.Mutex
	msgs       []*stored
	changed    chan struct{} // closed and replaced when a message may have become deliverable
	nextDeliv  int
	deliveries uint64
	dead       []DeadLetter
}

// stored is a published message.
type stored struct {
	id   string
	d    Delivery
	done bool

	deliveries  int
	live        map[int]*delivery // deliveries in flight, by number
	availableAt time.Time         // after Retry
	// extra are deliveries owed at once: nil to any source, a source to
	// any other source (a concurrent duplicate).
	extra []*source

	duplicate, concurrent, dropAck bool // the fault, until it fires
}

// delivery is one delivery of a message, the Handle of its consumer.Message.
type delivery struct {
	n        int
	msg      *stored
	src      *source
	attempt  int
	deadline time.Time
}

func newBroker(vis time.Duration) *broker {
	return &broker{vis: vis, changed: make(chan struct{})}
}

// publish adds a message with fault f (Once, Redelivered,
// ConcurrentDuplicate or CrashAfterCommit).
func (b *broker) publish(d Delivery, f Fault) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.msgs = append(b.msgs, &stored{
		id: strconv.Itoa(len(b.msgs) + 1), d: d, live: map[int]*delivery{},
		duplicate: f == Redelivered, concurrent: f == ConcurrentDuplicate, dropAck: f == CrashAfterCommit,
	})
}

// settled reports whether every message is acknowledged or dead-lettered,
// and how many deliveries were made.
func (b *broker) settled() (bool, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.msgs {
		if !m.done {
			return false, b.deliveries
		}
	}
	return true, b.deliveries
}

// pending describes the messages not settled yet, for a replay that does
// not settle.
func (b *broker) pending() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	var ready, inFlight, waiting int
	for _, m := range b.msgs {
		switch {
		case m.done:
		case len(m.live) > 0:
			inFlight++
		case now.Before(m.availableAt):
			waiting++
		default:
			ready++
		}
	}
	return fmt.Sprintf("broker: %d ready, %d in flight, %d pending", ready, inFlight, waiting)
}

// deadLetters returns the dead-lettered messages, in order.
func (b *broker) deadLetters() []DeadLetter {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.dead)
}

// wake tells waiting Receives to look again. b.mu is held.
func (b *broker) wake() {
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *broker) settle(m *stored) {
	m.done = true
	clear(m.live)
	m.extra = nil
	b.wake() // the next message of its partition key may be deliverable now
}

// source is one worker's consumer.Source on the broker.
type source struct {
	b      *broker
	closed bool // guarded by b.mu
	done   chan struct{}
}

func (b *broker) source() *source { return &source{b: b, done: make(chan struct{})} }

func (s *source) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	for {
		s.b.mu.Lock()
		if s.closed {
			s.b.mu.Unlock()
			return nil, consumer.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			s.b.mu.Unlock()
			return nil, err
		}
		now := time.Now()
		msgs, wake := s.take(now, max)
		changed := s.b.changed
		s.b.mu.Unlock()
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

// take delivers up to max messages to s and returns them with the next time
// something becomes deliverable (zero: none). s.b.mu is held.
func (s *source) take(now time.Time, max int) ([]*consumer.Message, time.Time) {
	b := s.b
	var (
		out     []*consumer.Message
		wake    time.Time
		blocked = map[string]bool{} // partition keys whose next message must not go to s
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
	deliver := func(m *stored) {
		m.deliveries++
		b.nextDeliv++
		b.deliveries++
		d := &delivery{n: b.nextDeliv, msg: m, src: s, attempt: m.deliveries, deadline: now.Add(b.vis)}
		m.live[d.n] = d
		later(d.deadline)
		out = append(out, &consumer.Message{
			ID: m.id, Key: m.d.Key, Body: append([]byte(nil), m.d.Body...), Headers: maps.Clone(m.d.Headers),
			PartitionKey: m.d.PartitionKey, Topic: topic, Attempt: d.attempt, Redelivered: d.attempt > 1,
			ReceivedAt: now, Handle: d,
		})
	}
	owed := func(m *stored) {
		for i := 0; i < len(m.extra) && len(out) < max; {
			if m.extra[i] == s {
				i++
				continue
			}
			m.extra = append(m.extra[:i], m.extra[i+1:]...)
			deliver(m)
		}
	}
	for _, m := range b.msgs {
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
			} else {
				delete(m.live, n)
			}
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

// current returns msg's delivery if it is still in flight, nil if the
// message is already settled. s.b.mu is held.
func (s *source) current(ctx context.Context, msg *consumer.Message, now time.Time) (*delivery, error) {
	if s.closed {
		return nil, consumer.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d, ok := msg.Handle.(*delivery)
	if !ok || d == nil || d.src != s {
		return nil, fmt.Errorf("consumertest: message %q was not received by this source", msg.ID)
	}
	if d.msg.done {
		return nil, nil
	}
	if d.msg.live[d.n] != d || !now.Before(d.deadline) {
		delete(d.msg.live, d.n)
		s.b.wake()
		return nil, fmt.Errorf("consumertest: message %q attempt %d: %w", msg.ID, d.attempt, errExpired)
	}
	return d, nil
}

func (s *source) Ack(ctx context.Context, msgs []*consumer.Message) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	now := time.Now()
	var errs []error
	for _, cm := range msgs {
		d, err := s.current(ctx, cm, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if d == nil {
			continue
		}
		if d.msg.dropAck { // a crash between the commit and the ack
			d.msg.dropAck = false
			continue
		}
		s.b.settle(d.msg)
	}
	return errors.Join(errs...)
}

func (s *source) Retry(ctx context.Context, msg *consumer.Message, delay time.Duration) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	now := time.Now()
	d, err := s.current(ctx, msg, now)
	if err != nil || d == nil {
		return err
	}
	delete(d.msg.live, d.n)
	d.msg.availableAt = now.Add(max(delay, 0))
	s.b.wake()
	return nil
}

func (s *source) DeadLetter(ctx context.Context, msg *consumer.Message, reason error) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	now := time.Now()
	d, err := s.current(ctx, msg, now)
	if err != nil || d == nil {
		return err
	}
	if reason == nil {
		reason = errors.New("consumertest: dead-lettered without a reason")
	}
	m := d.msg
	s.b.dead = append(s.b.dead, DeadLetter{
		ID: m.id, Key: m.d.Key, Body: m.d.Body, Headers: m.d.Headers, PartitionKey: m.d.PartitionKey,
		Reason: reason.Error(), Err: reason, Attempts: d.attempt, At: now,
	})
	s.b.settle(m)
	return nil
}

func (s *source) Close() error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.done)
	for _, m := range s.b.msgs {
		for n, d := range m.live {
			if d.src == s {
				delete(m.live, n)
			}
		}
	}
	s.b.wake()
	return nil
}
