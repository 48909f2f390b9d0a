package amqpsource

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/internal/brokerkit"
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

	dead chan struct{} // closed by kill

	// ackMu guards pending and settled and serialises acknowledgements, so
	// that a multiple-ack never covers a tag that was not passed to Ack.
	ackMu sync.Mutex
	// pending holds the tags forwarded towards Receive whose
	// acknowledgement or reject was not sent yet, in ascending order (the
	// broker issues tags in ascending order and one goroutine forwards
	// them).
	pending []uint64
	// settled maps every pending tag to the time Ack was called for it (a
	// clock reading), or to 0 while it is not acknowledged.
	settled map[uint64]int64
	// born is when the session was made: clock counts from it.
	born time.Time
	// kick wakes ackLoop after an Ack.
	kick chan struct{}
	// holdFor and holdMax bound how long and how many settled tags behind
	// an unsettled one wait for a multiple-ack (Config.AckHold, half the
	// prefetch; see flushLocked); holdFor 0 holds none.
	holdFor time.Duration
	holdMax int
	// flushNow ends the hold at the next pass: an acknowledgement that must
	// not wait (see ack) was recorded.
	flushNow bool
	// stats is the source's; ackLoop counts what it sends.
	stats *counters

	// pubMu serialises publishes of retry and dead-letter copies, so that a
	// returned copy is attributed to the publish that caused it.
	pubMu     sync.Mutex
	pub       *amqp.Channel
	returns   chan amqp.Return
	pubClosed chan *amqp.Error
	declared  map[string]time.Time // when each retry queue was last declared on pub
}

// dial opens a connection and a consuming channel, declares the topology if
// configured, and starts consuming.
func (s *Source) dial(ctx context.Context) (*session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("amqpsource: connect: %w", err)
	}
	sess := &session{
		conn:       conn,
		connClosed: conn.NotifyClose(make(chan *amqp.Error, 1)),
		dead:       make(chan struct{}),
		settled:    make(map[uint64]int64),
		born:       time.Now(),
		kick:       make(chan struct{}, 1),
		stats:      &s.stats,
	}
	if s.cfg.AckHold > 0 {
		sess.holdFor, sess.holdMax = s.cfg.AckHold, s.cfg.Prefetch/2
	}
	fail := func(what string, err error) (*session, error) {
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		return nil, fmt.Errorf("amqpsource: %s: %w", what, err)
	}
	if err := ctx.Err(); err != nil {
		return fail("connect", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail("open channel", err)
	}
	sess.ch = ch
	sess.chClosed = ch.NotifyClose(make(chan *amqp.Error, 1))
	sess.cancelled = ch.NotifyCancel(make(chan string, 1))
	if s.cfg.Declare != nil {
		if err := declareTopology(ch, s.cfg); err != nil {
			return fail("declare topology", err)
		}
	}
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return fail("set prefetch", err)
	}
	sess.deliveries, err = ch.Consume(s.cfg.Queue, s.cfg.ConsumerTag, false, false, false, false, nil)
	if err != nil {
		return fail(fmt.Sprintf("consume queue %q", s.cfg.Queue), err)
	}
	sess.gen = s.gen.Add(1)
	go sess.ackLoop()
	return sess, nil
}

// connect dials the broker. Unless Config.AMQP.Dial is set, the TCP dial and
// the handshake are bounded by ConnectTimeout and abandoned when ctx is done.
func (s *Source) connect(ctx context.Context) (*amqp.Connection, error) {
	ac := s.cfg.AMQP
	stop := func() bool { return false }
	defer func() { stop() }()
	if ac.Dial == nil {
		ac.Dial = func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: s.cfg.ConnectTimeout}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Heartbeats start after the handshake; until then a deadline
			// keeps a dead server from stalling the dial. The client clears
			// it once the connection is open.
			if err := c.SetDeadline(time.Now().Add(s.cfg.ConnectTimeout)); err != nil {
				_ = c.Close()
				return nil, err
			}
			stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
			return c, nil
		}
	}
	return amqp.DialConfig(s.cfg.URL, ac)
}

// supervise forwards deliveries of the current session and, when it dies,
// reconnects with backoff until Close, which cancels ctx. Its log lines
// carry ctx's values.
func (s *Source) supervise(ctx context.Context, sess *session) {
	defer s.wg.Done()
	backoff := consumer.RetryPolicy{
		MaxAttempts:    1,
		InitialBackoff: s.cfg.ReconnectDelay,
		MaxBackoff:     s.cfg.MaxReconnectDelay,
		Multiplier:     2,
		Jitter:         0.2,
	}
	failures := 0
	var warnings brokerkit.Warnings
	for {
		if sess != nil {
			cause := s.forward(sess)
			sess.kill()
			if s.isClosing() {
				return
			}
			s.stats.reconnects.Add(1)
			s.log.WarnContext(ctx, "connection lost; unacknowledged deliveries return to the queue; reconnecting",
				logKeyGeneration, sess.gen, consumer.LogKeyError, cause)
			sess = nil
		}
		failures++
		if !brokerkit.Sleep(s.closing, backoff.Backoff(failures)) {
			return
		}
		next, err := s.dial(ctx)
		if err != nil {
			if s.isClosing() {
				return
			}
			// The broker may be away for long, and the attempts come
			// every MaxReconnectDelay.
			if warnings.Due(failures) {
				s.log.WarnContext(ctx, "reconnect failed", consumer.LogKeyAttempt, failures, consumer.LogKeyError, err)
			}
			continue
		}
		s.log.InfoContext(ctx, "reconnected", logKeyGeneration, next.gen, consumer.LogKeyAttempt, failures)
		failures = 0
		sess = next
	}
}

// forward hands sess's deliveries to Receive until the session dies or the
// source closes, and returns why it stopped. It takes the next delivery only
// once Receive has taken the one before (out is nil while none waits).
func (s *Source) forward(sess *session) error {
	var next inbound
	var out chan<- inbound
	deliveries := sess.deliveries
	for {
		select {
		case <-s.closing:
			return nil
		case e := <-sess.connClosed:
			return closeCause("connection", e)
		case e := <-sess.chClosed:
			return closeCause("channel", e)
		case tag := <-sess.cancelled:
			return fmt.Errorf("amqpsource: broker cancelled consumer %q (queue deleted?)", tag)
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("amqpsource: delivery channel closed")
			}
			sess.track(d.DeliveryTag)
			next, out, deliveries = inbound{sess: sess, d: d}, s.in, nil
		case out <- next:
			out, deliveries = nil, sess.deliveries
		}
	}
}

func closeCause(what string, e *amqp.Error) error {
	if e == nil {
		return fmt.Errorf("amqpsource: %s closed", what)
	}
	return fmt.Errorf("amqpsource: %s closed: %w", what, e)
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

// kill sends the acknowledgements still owed (if the channel is alive),
// marks the session dead and closes its connection. The broker puts every
// unacknowledged delivery of the session back in its queue. It is called
// once per session.
func (s *session) kill() {
	s.ackMu.Lock()
	if s.alive() {
		if _, err := s.flushLocked(0); err != nil {
			s.ackFailedLocked()
		}
	}
	close(s.dead)
	s.ackMu.Unlock()
	// An error means the connection was closed already (the broker dropped
	// it) or the close handshake timed out; either way the socket is closed.
	_ = s.conn.CloseDeadline(time.Now().Add(closeTimeout))
}

// track records a tag forwarded towards Receive.
func (s *session) track(tag uint64) {
	s.ackMu.Lock()
	s.pending = append(s.pending, tag)
	s.settled[tag] = 0
	s.ackMu.Unlock()
}

// ack records that tags may be acknowledged and wakes ackLoop, which sends
// the acknowledgements; it does not wait for them. Unless hold, the next
// pass holds nothing back (see flushLocked): Retry and DeadLetter
// acknowledge an original whose copy is out, and a crash before that
// acknowledgement brings both back. It records nothing when the session is
// dead.
func (s *session) ack(tags []uint64, hold bool) error {
	now := s.clock()
	s.ackMu.Lock()
	if !s.alive() {
		s.ackMu.Unlock()
		return ErrStaleDelivery
	}
	// Tags not pending were settled before (or never issued): acknowledging
	// them would close the channel with PRECONDITION_FAILED.
	unknown := 0
	for _, t := range tags {
		if at, ok := s.settled[t]; !ok || at != 0 {
			unknown++
			continue
		}
		s.settled[t] = now
	}
	s.flushNow = s.flushNow || !hold
	s.ackMu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default: // a wake-up is pending already
	}
	if unknown > 0 {
		return fmt.Errorf("amqpsource: %d delivery tag(s) already settled; not acknowledged again", unknown)
	}
	return nil
}

// clock returns the nanoseconds since the session was made, plus one: a
// monotonic reading (a wall-clock step does not stretch a hold) that is
// never 0.
func (s *session) clock() int64 { return int64(time.Since(s.born)) + 1 }

// ackLoop sends the acknowledgements recorded by ack until the session
// dies, so that those recorded while a pass runs share a frame and no worker
// waits for a socket write. A timer runs the next pass when a hold ends.
func (s *session) ackLoop() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-s.dead:
			return
		case <-s.kick:
		case <-timer.C:
		}
		s.ackMu.Lock()
		if !s.alive() {
			s.ackMu.Unlock()
			return
		}
		wait, err := s.flushLocked(s.clock())
		if err != nil {
			s.ackFailedLocked()
			s.ackMu.Unlock()
			return // the channel is closing; supervise replaces the session
		}
		s.ackMu.Unlock()
		if wait > 0 {
			timer.Reset(wait)
		}
	}
}

// flushLocked sends the acknowledgements owed: one multiple-ack (or a
// single ack) for the longest settled prefix of pending, then the settled
// tags behind an unsettled one, each as a single ack, unless it holds them
// back for a later multiple-ack (Config.AckHold): while there are at most
// holdMax of them, the oldest was recorded less than holdFor before now,
// now is not 0 (the session is ending) and flushNow is not set. wait is how
// long the hold may still last (0 when nothing is held). A send error means
// the channel is closing: the broker redelivers what was not sent.
func (s *session) flushLocked(now int64) (wait time.Duration, err error) {
	prefix := 0
	for prefix < len(s.pending) && s.settled[s.pending[prefix]] != 0 {
		prefix++
	}
	if prefix > 0 {
		if err := s.ch.Ack(s.pending[prefix-1], prefix > 1); err != nil {
			return 0, fmt.Errorf("%w: %w", ErrStaleDelivery, err)
		}
		s.stats.ackFrames.Add(1)
		s.stats.acked.Add(uint64(prefix))
		for _, t := range s.pending[:prefix] {
			delete(s.settled, t)
		}
		s.pending = slices.Delete(s.pending, 0, prefix)
	}
	held, oldest := 0, int64(math.MaxInt64)
	for _, t := range s.pending {
		if at := s.settled[t]; at != 0 {
			held++
			oldest = min(oldest, at)
		}
	}
	flushNow := s.flushNow
	s.flushNow = false
	if held == 0 {
		return 0, nil
	}
	if now != 0 && held <= s.holdMax && !flushNow {
		if left := s.holdFor - time.Duration(now-oldest); left > 0 {
			return left, nil
		}
	}
	kept := s.pending[:0]
	for _, t := range s.pending {
		if err == nil && s.settled[t] != 0 {
			if err = s.ch.Ack(t, false); err == nil {
				s.stats.ackFrames.Add(1)
				s.stats.acked.Add(1)
				delete(s.settled, t)
				continue
			}
			err = fmt.Errorf("%w: %w", ErrStaleDelivery, err)
		}
		kept = append(kept, t)
	}
	s.pending = kept
	return 0, err
}

// ackFailedLocked counts the recorded acknowledgements that could not be
// sent because the channel closed, and forgets them; the broker redelivers
// those deliveries.
func (s *session) ackFailedLocked() {
	for t, at := range s.settled {
		if at != 0 {
			s.stats.staleSettles.Add(1)
			s.settled[t] = 0
		}
	}
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
	if i < 0 || s.settled[tag] != 0 {
		return false, nil
	}
	s.pending = slices.Delete(s.pending, i, i+1)
	delete(s.settled, tag)
	if err := s.ch.Reject(tag, true); err != nil {
		// The channel is closing: the broker requeues the delivery itself.
		return false, fmt.Errorf("%w: %w", ErrStaleDelivery, err)
	}
	return true, nil
}

// publish publishes p with the mandatory flag on the session's confirm
// channel and waits for the broker's confirm. retryArgs, when not nil,
// declares the retry queue named key with them first: before the first
// publish to it on this confirm channel, and again once every has passed
// since (every > 0; see Config.retryRedeclareEvery). A copy the broker
// returns as unroutable, or whose exchange does not exist, yields
// ErrUnroutable; a publishing channel closed before the confirm yields
// ErrPublishChannelClosed.
func (s *session) publish(ctx context.Context, exchange, key string, p amqp.Publishing, retryArgs amqp.Table, every time.Duration) error {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	if !s.alive() {
		return ErrStaleDelivery
	}
	ch, err := s.confirmChannel()
	if err != nil {
		return err
	}
	if retryArgs != nil {
		last, ok := s.declared[key]
		if now := time.Now(); !ok || (every > 0 && now.Sub(last) >= every) {
			if _, err := ch.QueueDeclare(key, true, false, false, false, retryArgs); err != nil {
				s.dropConfirmChannel()
				return retryDeclareError(key, err)
			}
			s.declared[key] = now
		}
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
		// The client hands the broker's reason for closing the channel to
		// the buffered NotifyClose channel before it closes s.returns.
		var cause error = amqp.ErrClosed
		select {
		case e, ok := <-s.pubClosed:
			if ok && e != nil {
				cause = e
			}
		default:
		}
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
	s.declared = make(map[string]time.Time)
	return ch, nil
}

// dropConfirmChannel closes the publishing channel after a failure; the next
// publish opens a new one. The caller holds pubMu.
func (s *session) dropConfirmChannel() {
	if s.pub != nil {
		_ = s.pub.Close()
		s.pub = nil
	}
}
