package memsource

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/memqueue"
)

// SourceOption configures one Source.
type SourceOption func(*sourceOptions)

type sourceOptions struct {
	name       string
	visibility time.Duration
}

// WithName names the Source in events (Event.Source). Defaults to
// "source-N", N counting the broker's sources from 1.
func WithName(name string) SourceOption {
	return func(o *sourceOptions) { o.name = name }
}

// WithVisibilityTimeout overrides Config.VisibilityTimeout for the messages
// this Source receives. Values below 1 ms are raised to 1 ms.
func WithVisibilityTimeout(d time.Duration) SourceOption {
	return func(o *sourceOptions) { o.visibility = max(d, time.Millisecond) }
}

// Source is a consumer of one topic of a Broker; it implements
// consumer.Source. Sources on the same topic compete for its messages. A
// Source is safe for concurrent use.
//
// Message.Raw of a received message is an Outgoing with the message's key,
// body, headers and partition key (read-only); consumer.Delivery.Handle identifies the
// delivery.
type Source struct {
	b    *Broker
	t    *topic
	name string
	vis  time.Duration

	closed bool          // guarded by b.mu
	done   chan struct{} // closed by Close
}

var _ consumer.Source = (*Source)(nil)

// Source opens a consumer of topic (creating the topic if needed). A Source
// opened on a closed broker is closed already.
func (b *Broker) Source(topicName string, opts ...SourceOption) *Source {
	o := sourceOptions{visibility: b.cfg.VisibilityTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nextSource++
	if o.name == "" {
		o.name = fmt.Sprintf("source-%d", b.nextSource)
	}
	s := &Source{b: b, t: b.topicLocked(topicName), name: o.name, vis: o.visibility, done: make(chan struct{})}
	if b.closed {
		s.closed = true
		close(s.done)
		return s
	}
	b.sources[s] = struct{}{}
	return s
}

// Name returns the Source's name.
func (s *Source) Name() string { return s.name }

// Topic returns the name of the Source's topic.
func (s *Source) Topic() string { return s.t.name }

// String names the source for logs (the Runner's start line): "memsource
// topic=<topic>".
func (s *Source) String() string { return "memsource topic=" + s.t.name }

// Receive blocks until a message is deliverable, then returns up to max of
// them, in publish order (see the package documentation for the
// partition-key order). It returns ctx.Err() when ctx is done,
// consumer.ErrClosed once the Source is closed (also when Close interrupts
// it), and an error matching ErrUnavailable while the broker is unreachable
// or a receive fault fires.
func (s *Source) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	if max < 1 {
		return nil, fmt.Errorf("memsource: Receive: max must be at least 1, got %d", max)
	}
	b, t := s.b, s.t
	first := true
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
		if b.unavailable {
			b.mu.Unlock()
			return nil, ErrUnavailable
		}
		if first {
			first = false
			if f := b.fire(ctx, ReceiveError, t, nil); f != nil {
				b.mu.Unlock()
				return nil, fmt.Errorf("%w: %w", ErrUnavailable, f.err())
			}
		}
		now := time.Now()
		msgs, events, wake := s.take(ctx, now, max)
		changed := t.queue.Changed()
		b.mu.Unlock()
		b.emit(events...)
		if len(msgs) > 0 {
			return msgs, nil
		}

		memqueue.Wait(ctx, s.done, changed, wake.Sub(now), !wake.IsZero())
	}
}

// take delivers up to max messages to s and returns them, the events to emit,
// and the earliest future instant at which a delivery may expire or a delayed
// message become ready (zero if none). b.mu is held.
func (s *Source) take(ctx context.Context, now time.Time, max int) ([]*consumer.Message, []Event, time.Time) {
	b, t := s.b, s.t
	var (
		out    []*consumer.Message
		events []Event
	)
	wake := t.queue.Take(s, now, max, s.vis, memqueue.Hooks[Outgoing, *Source]{
		Deliver: func(d *delivery) {
			m := d.Msg
			t.stats.Deliveries++
			if d.Attempt > 1 {
				t.stats.Redeliveries++
			}
			raw := Outgoing{Key: m.Payload.Key, Body: append([]byte(nil), m.Payload.Body...), Headers: maps.Clone(m.Payload.Headers), PartitionKey: m.Payload.PartitionKey}
			out = append(out, consumer.Deliver(&consumer.Message{
				ID:            m.ID,
				Key:           raw.Key,
				Body:          raw.Body,
				Headers:       raw.Headers,
				PartitionKey:  raw.PartitionKey,
				Topic:         t.name,
				Attempt:       d.Attempt,
				Redelivered:   d.Attempt > 1,
				ReplyTo:       raw.Headers[consumer.HeaderReplyTo],
				CorrelationID: raw.Headers[consumer.HeaderCorrelationID],
				ReceivedAt:    now,
				Raw:           raw,
			}, consumer.Delivery{Handle: d}))
			events = append(events, b.event(EventReceive, t, s, m, d.Attempt, nil))
		},
		Expire: func(d *delivery) {
			t.stats.Expired++
			events = append(events, b.event(EventExpire, t, d.Src, d.Msg, d.Attempt, nil))
			b.log.DebugContext(ctx, "memsource: visibility timeout passed", consumer.LogKeyQueue, t.name, "message_id", d.Msg.ID, "attempt", d.Attempt)
		},
		Copies: func(m *stored) (duplicate, concurrent bool) {
			return b.fire(ctx, Redelivered, t, m) != nil, b.fire(ctx, ConcurrentDuplicate, t, m) != nil
		},
	})
	return out, events, wake
}

// current returns the delivery of msg if it still counts, expiring it if its
// visibility timeout passed. The returned delivery is nil when the message was
// settled already (the call is then a no-op). b.mu is held.
func (s *Source) current(msg *consumer.Message, now time.Time, events *[]Event) (*delivery, error) {
	d, ok := consumer.DeliveryOf(msg).Handle.(*delivery)
	if !ok || d == nil || d.Src != s {
		return nil, fmt.Errorf("memsource: message %q: %w", msg.ID, ErrForeignMessage)
	}
	switch s.t.queue.Check(d, now) {
	case memqueue.Settled:
		return nil, nil
	case memqueue.Expired:
		return nil, fmt.Errorf("memsource: message %q attempt %d: %w", d.Msg.ID, d.Attempt, ErrDeliveryExpired)
	case memqueue.TimedOut:
		s.t.stats.Expired++
		*events = append(*events, s.b.event(EventExpire, s.t, s, d.Msg, d.Attempt, nil))
		return nil, fmt.Errorf("memsource: message %q attempt %d: visibility timeout passed: %w", d.Msg.ID, d.Attempt, ErrDeliveryExpired)
	}
	return d, nil
}

// usable reports why s cannot be used now, if it cannot. b.mu is held.
func (s *Source) usable(ctx context.Context) error {
	switch {
	case s.closed:
		return consumer.ErrClosed
	case ctx.Err() != nil:
		return ctx.Err()
	case s.b.unavailable:
		return ErrUnavailable
	}
	return nil
}

// Ack acknowledges msgs: they will not be delivered again. A message already
// acknowledged or dead-lettered is skipped. A message whose delivery expired
// (visibility timeout, Close, Restart) is not acknowledged and reported with
// ErrDeliveryExpired; the others of the call are acknowledged. The error
// joins the failures of every message.
func (s *Source) Ack(ctx context.Context, msgs []*consumer.Message) error {
	b, t := s.b, s.t
	b.mu.Lock()
	if err := s.usable(ctx); err != nil {
		b.mu.Unlock()
		return err
	}
	now := time.Now()
	var events []Event
	var errs []error
	for _, cm := range msgs {
		d, err := s.current(cm, now, &events)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if d == nil {
			continue
		}
		m := d.Msg
		if b.fire(ctx, CrashAfterCommit, t, m) != nil {
			t.stats.DroppedAcks++
			events = append(events, b.event(EventAckDropped, t, s, m, d.Attempt, nil))
			continue
		}
		if f := b.fire(ctx, AckError, t, m); f != nil {
			t.stats.DroppedAcks++
			events = append(events, b.event(EventAckDropped, t, s, m, d.Attempt, f.err()))
			errs = append(errs, fmt.Errorf("memsource: ack of message %q: %w", m.ID, f.err()))
			continue
		}
		t.stats.Acks++
		t.queue.Settle(m)
		events = append(events, b.event(EventAck, t, s, m, d.Attempt, nil))
	}
	b.mu.Unlock()
	b.emit(events...)
	if len(errs) > 0 {
		return fmt.Errorf("memsource: %d of %d acknowledgement(s) failed: %w", len(errs), len(msgs), errors.Join(errs...))
	}
	return nil
}

// Retry hands msg back: it is delivered again, with Attempt increased, no
// sooner than delay from now. Retrying a message already settled is a no-op.
func (s *Source) Retry(ctx context.Context, msg *consumer.Message, delay time.Duration) error {
	return s.settle(ctx, msg, RetryError, "retry", func(d *delivery, now time.Time) Event {
		s.t.queue.Retry(d, now, delay)
		s.t.stats.Retries++
		ev := s.b.event(EventRetry, s.t, s, d.Msg, d.Attempt, nil)
		ev.Delay = delay
		return ev
	})
}

// DeadLetter moves msg to its topic's dead-letter list (see
// Broker.DeadLetters) with reason and the delivery's attempt, and removes it
// from the topic. Dead-lettering a message already settled is a no-op.
func (s *Source) DeadLetter(ctx context.Context, msg *consumer.Message, reason error) error {
	return s.settle(ctx, msg, DeadLetterError, "dead-letter", func(d *delivery, now time.Time) Event {
		if reason == nil {
			reason = errors.New("memsource: dead-lettered without a reason")
		}
		m, t := d.Msg, s.t
		out := m.Payload
		t.dead = append(t.dead, DeadLetter{
			ID: m.ID, Key: out.Key, Body: out.Body, Headers: out.Headers, PartitionKey: out.PartitionKey,
			Reason: reason.Error(), Err: reason, Attempts: d.Attempt, At: now,
		})
		t.stats.DeadLettered++
		t.queue.Settle(m)
		return s.b.event(EventDeadLetter, t, s, m, d.Attempt, reason)
	})
}

// settle applies a Retry or DeadLetter (what) of msg under the broker's
// lock: apply changes the topic for the message's current delivery and
// returns its event, unless fault fires (then the call fails) or the
// message is already settled (a no-op).
func (s *Source) settle(ctx context.Context, msg *consumer.Message, fault FaultKind, what string, apply func(d *delivery, now time.Time) Event) error {
	b := s.b
	b.mu.Lock()
	if err := s.usable(ctx); err != nil {
		b.mu.Unlock()
		return err
	}
	now := time.Now()
	var events []Event
	d, err := s.current(msg, now, &events)
	if err == nil && d != nil {
		if f := b.fire(ctx, fault, s.t, d.Msg); f != nil {
			err = fmt.Errorf("memsource: %s of message %q: %w", what, d.Msg.ID, f.err())
		} else {
			events = append(events, apply(d, now))
		}
	}
	b.mu.Unlock()
	b.emit(events...)
	return err
}

// Close closes the Source: its unsettled messages are returned to the topic at
// once (delivered again with Attempt increased), blocked Receive calls return
// consumer.ErrClosed, and every later call fails with consumer.ErrClosed.
// Close is idempotent and always returns nil.
func (s *Source) Close() error {
	b, t := s.b, s.t
	b.mu.Lock()
	if s.closed {
		b.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	delete(b.sources, s)
	var events []Event
	t.queue.Release(s, false, func(m *stored) {
		events = append(events, b.event(EventReturn, t, s, m, m.Deliveries, nil))
	})
	events = append(events, b.event(EventClose, t, s, nil, 0, nil))
	b.mu.Unlock()
	b.emit(events...)
	return nil
}
