package amqpsource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// closeTimeout bounds the close handshake of a connection.
const closeTimeout = 5 * time.Second

// session is one connection with its consuming channel. Delivery tags are
// valid only on the channel that issued them, so every handle points to its
// session, and a session never comes back once it is dead: the reconnect loop
// builds a new one.
type session struct {
	gen        uint64
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	connClosed chan *amqp.Error
	chClosed   chan *amqp.Error
	cancelled  chan string

	dead     chan struct{}
	deadOnce sync.Once

	// ackMu guards pending and serialises acknowledgements, so that a
	// multiple-ack never covers a tag that is not being acknowledged.
	ackMu sync.Mutex
	// pending holds the tags forwarded towards Receive and not yet settled,
	// in ascending order (the broker issues tags in ascending order and one
	// goroutine forwards them).
	pending []uint64

	// pubMu serialises publishes of retry and dead-letter copies, so that a
	// returned copy is attributed to the publish that caused it.
	pubMu     sync.Mutex
	pub       *amqp.Channel
	returns   chan amqp.Return
	pubClosed chan *amqp.Error
	declared  map[string]bool
}

// alive reports whether the session's channel can still settle its tags.
func (s *session) alive() bool {
	select {
	case <-s.dead:
		return false
	default:
		return !s.ch.IsClosed()
	}
}

// kill marks the session dead and closes its connection. The broker puts
// every unacknowledged delivery of the session back in its queue.
func (s *session) kill() {
	s.deadOnce.Do(func() {
		close(s.dead)
		// An error means the connection was closed already (the broker
		// dropped it) or the close handshake timed out; either way the
		// socket is closed.
		_ = s.conn.CloseDeadline(time.Now().Add(closeTimeout))
	})
}

// track records a tag forwarded towards Receive.
func (s *session) track(tag uint64) {
	s.ackMu.Lock()
	s.pending = append(s.pending, tag)
	s.ackMu.Unlock()
}

// ack acknowledges tags on the session's channel. The longest prefix of the
// pending tags that is being acknowledged goes out as one multiple-ack; the
// rest one by one. It acknowledges nothing when the session is dead.
func (s *session) ack(tags []uint64) error {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	if !s.alive() {
		return ErrStaleDelivery
	}
	want := make(map[uint64]bool, len(tags))
	for _, t := range tags {
		want[t] = true
	}
	// Tags not pending were settled before (or never issued): acknowledging
	// them would close the channel with PRECONDITION_FAILED.
	prefix, found := 0, 0
	for i, t := range s.pending {
		if !want[t] {
			continue
		}
		found++
		if i == prefix {
			prefix++
		}
	}
	var unknown error
	if found != len(want) {
		unknown = fmt.Errorf("amqpsource: %d delivery tag(s) already settled; not acknowledged again", len(want)-found)
	}

	var err error
	switch {
	case prefix > 1:
		err = s.ch.Ack(s.pending[prefix-1], true)
	case prefix == 1:
		err = s.ch.Ack(s.pending[0], false)
	}
	for _, t := range s.pending[prefix:] {
		if err != nil {
			break
		}
		if want[t] {
			err = s.ch.Ack(t, false)
		}
	}
	s.pending = slices.DeleteFunc(s.pending, func(t uint64) bool { return want[t] })
	if err != nil {
		// The channel is closing: what was not sent is redelivered.
		return errors.Join(fmt.Errorf("%w: %w", ErrStaleDelivery, err), unknown)
	}
	return unknown
}

// requeue hands the delivery tag back to its queue (basic.reject with
// requeue) if it is still pending on a live channel, and reports whether it
// did. A tag settled meanwhile is left alone; a dead channel's tags are
// requeued by the broker already. The tag stays pending until this call, so
// that no multiple-ack covers it while it waits.
//
// basic.reject rather than basic.nack: since RabbitMQ 4.3 a quorum queue
// counts a requeue in x-delivery-count (and against its delivery limit) only
// for basic.reject, which signals a failed processing; before 4.3 it counts
// both. Counted, a message whose copies keep failing reaches the Runner's
// MaxAttempts or the delivery limit instead of cycling forever.
func (s *session) requeue(tag uint64) (bool, error) {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	if !s.alive() {
		return false, nil
	}
	i := slices.Index(s.pending, tag)
	if i < 0 {
		return false, nil
	}
	s.pending = slices.Delete(s.pending, i, i+1)
	if err := s.ch.Reject(tag, true); err != nil {
		// The channel is closing: the broker requeues the delivery itself.
		return false, fmt.Errorf("%w: %w", ErrStaleDelivery, err)
	}
	return true, nil
}

// publish publishes p with the mandatory flag on the session's confirm
// channel and waits for the broker's confirm. declare, when not nil, is run
// once per confirm channel before the first publish to key. A copy the broker
// returns as unroutable, or whose exchange does not exist, yields
// ErrUnroutable; a publishing channel closed before the confirm yields
// ErrPublishChannelClosed.
func (s *session) publish(ctx context.Context, exchange, key string, p amqp.Publishing, declare func(*amqp.Channel) error) error {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	if !s.alive() {
		return ErrStaleDelivery
	}
	ch, err := s.confirmChannel()
	if err != nil {
		return err
	}
	if declare != nil && !s.declared[key] {
		if err := declare(ch); err != nil {
			s.dropConfirmChannel()
			return err
		}
		s.declared[key] = true
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, p)
	if err != nil {
		s.dropConfirmChannel()
		return fmt.Errorf("amqpsource: publish to exchange %q key %q: %w", exchange, key, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		// A late confirm or return must not be attributed to a later
		// publish: start over on a fresh channel.
		s.dropConfirmChannel()
		return fmt.Errorf("%w: exchange %q key %q: %w", ErrNotConfirmed, exchange, key, err)
	}
	// The broker sends basic.return before the confirm, and the client
	// hands it to s.returns before it completes the confirm. When the channel
	// shuts down, the client closes s.returns (after handing over what was
	// returned) before it completes the outstanding confirms as negative.
	select {
	case r, ok := <-s.returns:
		if ok {
			delete(s.declared, key) // a retry queue deleted under us is declared again
			return fmt.Errorf("%w: exchange %q key %q: %d %s", ErrUnroutable, exchange, key, r.ReplyCode, r.ReplyText)
		}
		cause := s.pubCloseCause()
		s.dropConfirmChannel()
		if acked {
			// Confirmed before the channel closed, and not returned.
			return nil
		}
		var ae *amqp.Error
		if errors.As(cause, &ae) && ae.Code == amqp.NotFound {
			// basic.publish fails with NOT_FOUND only for a missing
			// exchange: the destination does not exist.
			return fmt.Errorf("%w: exchange %q does not exist: %w", ErrUnroutable, exchange, cause)
		}
		return fmt.Errorf("%w: exchange %q key %q: %w", ErrPublishChannelClosed, exchange, key, cause)
	default:
	}
	if !acked {
		return fmt.Errorf("%w: exchange %q key %q: negative confirm", ErrNotConfirmed, exchange, key)
	}
	return nil
}

// confirmChannel returns the session's publishing channel in confirm mode,
// opening it if needed. The caller holds pubMu.
func (s *session) confirmChannel() (*amqp.Channel, error) {
	if s.pub != nil && !s.pub.IsClosed() {
		return s.pub, nil
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqpsource: open publishing channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("amqpsource: enable publisher confirms: %w", err)
	}
	s.returns = ch.NotifyReturn(make(chan amqp.Return, 4))
	s.pubClosed = ch.NotifyClose(make(chan *amqp.Error, 1))
	s.pub = ch
	s.declared = make(map[string]bool)
	return ch, nil
}

// pubCloseCause returns why the publishing channel closed, as far as the
// client said. The client hands the broker's reason to the buffered
// NotifyClose channel before it closes the returns channel. The caller holds
// pubMu.
func (s *session) pubCloseCause() error {
	select {
	case e, ok := <-s.pubClosed:
		if ok && e != nil {
			return e
		}
	default:
	}
	return amqp.ErrClosed
}

// dropConfirmChannel closes the publishing channel after a failure; the next
// publish opens a new one. The caller holds pubMu.
func (s *session) dropConfirmChannel() {
	if s.pub != nil {
		_ = s.pub.Close()
		s.pub = nil
	}
}

// publishContext bounds ctx by timeout unless it has an earlier deadline.
func publishContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= timeout {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, timeout)
}
