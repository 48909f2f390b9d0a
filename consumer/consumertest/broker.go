package consumertest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/faults"
	"github.com/idemq/idemq/internal/memqueue"
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

// broker is the replay's in-memory broker: one queue (internal/memqueue),
// delivered to several sources (one per runner) at least once, with the
// faults of the script. A delivery that is not settled within vis is
// delivered again; the messages of one partition key are delivered one at a
// time, in publish order, as a real broker orders a partition. It keeps to
// what a replay needs; see sources/memsource for a scriptable broker with
// every fault.
type broker struct {
	vis time.Duration

	mu         sync.Mutex
	queue      *memqueue.Queue[*scripted, *source]
	dead       []DeadLetter
	sources    []*source
	deliveries uint64
	nextID     uint64
}

// scripted is one published message's script.
type scripted struct {
	d          Delivery
	duplicate  bool // the first delivery owes a copy to any source
	concurrent bool // the first delivery owes a copy to another source
	dropAck    bool // the first Ack is lost
}

type (
	message  = memqueue.Message[*scripted, *source]
	delivery = memqueue.Delivery[*scripted, *source]
)

// source is one runner's consumer.Source over the broker.
type source struct {
	b      *broker
	done   chan struct{}
	closed bool
}

func newBroker(vis time.Duration) *broker {
	return &broker{vis: vis, queue: memqueue.New[*scripted, *source]()}
}

// publish queues d with its fault.
func (b *broker) publish(d Delivery) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nextID++
	sc := &scripted{d: d}
	sc.d.Headers = maps.Clone(d.Headers)
	sc.d.Body = append([]byte(nil), d.Body...)
	switch d.Fault {
	case faults.Redelivered:
		sc.duplicate = true
	case faults.ConcurrentDuplicate:
		sc.concurrent = true
	case faults.CrashAfterCommit:
		sc.dropAck = true
	}
	b.queue.Publish(fmt.Sprintf("replay-%d", b.nextID), d.PartitionKey, sc)
	b.queue.Wake()
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
	return b.queue.Counts()
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
		changed := b.queue.Changed()
		b.mu.Unlock()
		if len(msgs) > 0 {
			return msgs, nil
		}
		memqueue.Wait(ctx, s.done, changed, wake.Sub(now), !wake.IsZero())
	}
}

// take delivers up to max messages to s, and returns them and the earliest
// instant at which a delivery may expire or a delayed message become ready
// (zero if none). b.mu is held.
func (s *source) take(now time.Time, max int) ([]*consumer.Message, time.Time) {
	b := s.b
	var out []*consumer.Message
	wake := b.queue.Take(s, now, max, b.vis, memqueue.Hooks[*scripted, *source]{
		Deliver: func(d *delivery) {
			b.deliveries++
			sc := d.Msg.Payload
			out = append(out, &consumer.Message{
				ID:           d.Msg.ID,
				Key:          sc.d.Key,
				Body:         append([]byte(nil), sc.d.Body...),
				Headers:      maps.Clone(sc.d.Headers),
				PartitionKey: sc.d.PartitionKey,
				Topic:        topic,
				Attempt:      d.Attempt,
				Redelivered:  d.Attempt > 1,
				ReceivedAt:   now,
				Handle:       d,
			})
		},
		Copies: func(m *message) (duplicate, concurrent bool) {
			sc := m.Payload
			duplicate, concurrent = sc.duplicate, sc.concurrent
			sc.duplicate, sc.concurrent = false, false
			return duplicate, concurrent
		},
	})
	return out, wake
}

// current returns the delivery of msg if it still counts (nil when the
// message is settled already), expiring it if its visibility timeout
// passed. b.mu is held.
func (s *source) current(msg *consumer.Message, now time.Time) (*delivery, error) {
	d, ok := msg.Handle.(*delivery)
	if !ok || d == nil || d.Src != s {
		return nil, fmt.Errorf("consumertest: message %q was not received by this source", msg.ID)
	}
	if s.closed {
		return nil, consumer.ErrClosed
	}
	switch s.b.queue.Check(d, now) {
	case memqueue.Settled:
		return nil, nil
	case memqueue.Expired, memqueue.TimedOut:
		return nil, fmt.Errorf("message %q attempt %d: %w", d.Msg.ID, d.Attempt, errExpired)
	}
	return d, nil
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
		if sc := d.Msg.Payload; sc.dropAck {
			sc.dropAck = false
			continue
		}
		b.queue.Settle(d.Msg)
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
	b.queue.Retry(d, now, delay)
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
	sc := d.Msg.Payload
	b.dead = append(b.dead, DeadLetter{
		ID: d.Msg.ID, Key: sc.d.Key, Body: sc.d.Body, Headers: maps.Clone(sc.d.Headers), PartitionKey: sc.d.PartitionKey,
		Reason: reason.Error(), Err: reason, Attempts: d.Attempt, At: now,
	})
	b.queue.Settle(d.Msg)
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
	b.queue.Release(s, false, nil)
	return nil
}
