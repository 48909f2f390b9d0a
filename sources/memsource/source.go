package memsource

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/idemq/idemq/consumer"
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
// body, headers and partition key (read-only); Message.Handle identifies the
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
			if f := b.fire(ctx, FaultReceiveError, t, nil); f != nil {
				b.mu.Unlock()
				return nil, fmt.Errorf("%w: %w", ErrUnavailable, f.err())
			}
		}
		now := time.Now()
		msgs, events, wake := s.take(ctx, now, max)
		changed := t.changed
		b.mu.Unlock()
		b.emit(events...)
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

// take delivers up to max messages to s and returns them, the events to emit,
// and the earliest future instant at which a delivery may expire or a delayed
// message become ready (zero if none). b.mu is held.
func (s *Source) take(ctx context.Context, now time.Time, max int) ([]*consumer.Message, []Event, time.Time) {
	b, t := s.b, s.t
	var (
		out     []*consumer.Message
		events  []Event
		wake    time.Time
		blocked map[string]bool // partition keys whose next message must not go to s
	)
	later := func(at time.Time) {
		if wake.IsZero() || at.Before(wake) {
			wake = at
		}
	}
	block := func(pk string) {
		if pk == "" {
			return
		}
		if blocked == nil {
			blocked = make(map[string]bool)
		}
		blocked[pk] = true
	}
	deliver := func(m *stored) {
		m.deliveries++
		b.nextDeliv++
		d := &delivery{n: b.nextDeliv, msg: m, src: s, attempt: m.deliveries, deadline: now.Add(s.vis)}
		m.live[d.n] = d
		later(d.deadline)
		t.stats.Deliveries++
		if m.deliveries > 1 {
			t.stats.Redeliveries++
		}
		raw := Outgoing{Key: m.out.Key, Body: append([]byte(nil), m.out.Body...), Headers: maps.Clone(m.out.Headers), PartitionKey: m.out.PartitionKey}
		out = append(out, &consumer.Message{
			ID:            m.id,
			Key:           raw.Key,
			Body:          raw.Body,
			Headers:       raw.Headers,
			PartitionKey:  raw.PartitionKey,
			Topic:         t.name,
			Attempt:       d.attempt,
			Redelivered:   d.attempt > 1,
			ReplyTo:       raw.Headers[consumer.HeaderReplyTo],
			CorrelationID: raw.Headers[consumer.HeaderCorrelationID],
			ReceivedAt:    now,
			Raw:           raw,
			Handle:        d,
		})
		events = append(events, b.event(EventReceive, t, s, m, d.attempt, nil))
	}
	// owed delivers the duplicate copies of m that s may take now.
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

	for _, m := range t.queue {
		if len(out) >= max {
			break
		}
		if m.done {
			continue
		}
		pk := m.out.PartitionKey
		for n, d := range m.live {
			if now.Before(d.deadline) {
				later(d.deadline)
				continue
			}
			delete(m.live, n)
			t.stats.Expired++
			events = append(events, b.event(EventExpire, t, d.src, m, d.attempt, nil))
			b.log.DebugContext(ctx, "memsource: visibility timeout passed", "topic", t.name, "message_id", m.id, "attempt", d.attempt)
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
		if b.fire(ctx, FaultDuplicate, t, m) != nil {
			m.extra = append(m.extra, nil)
		}
		if b.fire(ctx, FaultConcurrentDuplicate, t, m) != nil {
			m.extra = append(m.extra, s)
		}
		owed(m)
	}
	return out, events, wake
}

// current returns the delivery of msg if it still counts, expiring it if its
// visibility timeout passed. The returned *stored is nil when the message was
// settled already (the call is then a no-op). b.mu is held.
func (s *Source) current(msg *consumer.Message, now time.Time, events *[]Event) (*delivery, error) {
	d, ok := msg.Handle.(*delivery)
	if !ok || d == nil || d.src != s {
		return nil, fmt.Errorf("memsource: message %q: %w", msg.ID, ErrForeignMessage)
	}
	m := d.msg
	if m.done {
		return nil, nil
	}
	if m.live[d.n] != d {
		return nil, fmt.Errorf("memsource: message %q attempt %d: %w", m.id, d.attempt, ErrDeliveryExpired)
	}
	if !now.Before(d.deadline) {
		delete(m.live, d.n)
		s.t.stats.Expired++
		*events = append(*events, s.b.event(EventExpire, s.t, s, m, d.attempt, nil))
		s.t.wake()
		return nil, fmt.Errorf("memsource: message %q attempt %d: visibility timeout passed: %w", m.id, d.attempt, ErrDeliveryExpired)
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
		m := d.msg
		if b.fire(ctx, FaultDropAck, t, m) != nil {
			t.stats.DroppedAcks++
			events = append(events, b.event(EventAckDropped, t, s, m, d.attempt, nil))
			continue
		}
		if f := b.fire(ctx, FaultAckError, t, m); f != nil {
			t.stats.DroppedAcks++
			events = append(events, b.event(EventAckDropped, t, s, m, d.attempt, f.err()))
			errs = append(errs, fmt.Errorf("memsource: ack of message %q: %w", m.id, f.err()))
			continue
		}
		t.stats.Acks++
		t.settle(m)
		events = append(events, b.event(EventAck, t, s, m, d.attempt, nil))
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
	b, t := s.b, s.t
	b.mu.Lock()
	if err := s.usable(ctx); err != nil {
		b.mu.Unlock()
		return err
	}
	now := time.Now()
	var events []Event
	d, err := s.current(msg, now, &events)
	if err == nil && d != nil {
		m := d.msg
		if f := b.fire(ctx, FaultRetryError, t, m); f != nil {
			err = fmt.Errorf("memsource: retry of message %q: %w", m.id, f.err())
		} else {
			delete(m.live, d.n)
			m.availableAt = now.Add(max(delay, 0))
			t.stats.Retries++
			ev := b.event(EventRetry, t, s, m, d.attempt, nil)
			ev.Delay = delay
			events = append(events, ev)
			t.wake()
		}
	}
	b.mu.Unlock()
	b.emit(events...)
	return err
}

// DeadLetter moves msg to its topic's dead-letter list (see
// Broker.DeadLetters) with reason and the delivery's attempt, and removes it
// from the topic. Dead-lettering a message already settled is a no-op.
func (s *Source) DeadLetter(ctx context.Context, msg *consumer.Message, reason error) error {
	b, t := s.b, s.t
	b.mu.Lock()
	if err := s.usable(ctx); err != nil {
		b.mu.Unlock()
		return err
	}
	now := time.Now()
	var events []Event
	d, err := s.current(msg, now, &events)
	if err == nil && d != nil {
		m := d.msg
		if f := b.fire(ctx, FaultDeadLetterError, t, m); f != nil {
			err = fmt.Errorf("memsource: dead-letter of message %q: %w", m.id, f.err())
		} else {
			if reason == nil {
				reason = errors.New("memsource: dead-lettered without a reason")
			}
			t.dead = append(t.dead, DeadLetter{
				ID: m.id, Key: m.out.Key, Body: m.out.Body, Headers: m.out.Headers, PartitionKey: m.out.PartitionKey,
				Reason: reason.Error(), Err: reason, Attempts: d.attempt, At: now,
			})
			t.stats.DeadLettered++
			t.settle(m)
			events = append(events, b.event(EventDeadLetter, t, s, m, d.attempt, reason))
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
	for _, m := range t.queue {
		if m.done {
			continue
		}
		held := false
		for n, d := range m.live {
			if d.src == s {
				delete(m.live, n)
				held = true
			}
		}
		if held && len(m.live) == 0 {
			events = append(events, b.event(EventReturn, t, s, m, m.deliveries, nil))
		}
	}
	t.wake()
	events = append(events, b.event(EventClose, t, s, nil, 0, nil))
	b.mu.Unlock()
	b.emit(events...)
	return nil
}
