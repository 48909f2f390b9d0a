package amqpsource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/metatext"
	"github.com/idemq/idemq/sources/internal/brokerkit"
)

// Log attribute keys of the source, besides the Runner's (consumer.LogKey*).
const (
	logKeyGeneration = "channel_generation"
	logKeyRetryQueue = "retry_queue"
)

// maxReasonBytes caps the dead-letter reason header.
const maxReasonBytes = 4096

// Source consumes one RabbitMQ queue with manual acknowledgements. It
// implements consumer.Source and is safe for concurrent use: the Runner calls
// Receive from one goroutine and Ack, Retry and DeadLetter from several.
//
// Message.Raw is the amqp091.Delivery; do not settle it through its
// Acknowledger. consumer.Delivery.Handle holds the delivery tag and the channel session
// it belongs to.
type Source struct {
	cfg Config
	log *slog.Logger

	// in carries deliveries from the session forwarder to Receive.
	in      chan inbound
	closing <-chan struct{}
	stop    context.CancelFunc // closes closing
	once    sync.Once
	wg      sync.WaitGroup

	broker broker
	desc   string // String's

	gen   atomic.Uint64 // generation of the newest session
	stats counters
	// copyFailures counts the retry and dead-letter copies that failed in a
	// row; it grows the hold before their originals are requeued.
	copyFailures atomic.Int64
}

// counters are the source's statistics; see Stats.
type counters struct {
	reconnects, staleDropped, staleSettles, unroutable, requeued atomic.Uint64
	acked, ackFrames                                             atomic.Uint64
}

type inbound struct {
	sess *session
	d    amqp.Delivery
}

var _ consumer.Source = (*Source)(nil)

// New validates cfg (after WithDefaults), connects to the broker, declares
// cfg.Declare if set, and starts consuming cfg.Queue. It fails if the first
// connection cannot be made; after that the Source reconnects by itself until
// Close. ctx bounds only this first connection; its values (not its
// cancellation) are passed to the source's background log lines (reconnects),
// so that a trace-aware or service-tagging slog handler sees them.
func New(ctx context.Context, cfg Config) (*Source, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	u, _ := amqp.ParseURI(cfg.URL) // validate parsed it
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	s := &Source{
		cfg:     cfg,
		log:     cfg.Logger.With(consumer.LogKeyQueue, cfg.Queue),
		in:      make(chan inbound, cfg.Prefetch),
		closing: bg.Done(),
		stop:    stop,
		broker:  broker{queue: cfg.Queue, base: consumer.BrokerInfo{System: systemRabbitMQ, ServerAddress: u.Host, ServerPort: u.Port}},
		desc: fmt.Sprintf("rabbitmq %s vhost=%s queue=%s",
			net.JoinHostPort(u.Host, strconv.Itoa(u.Port)), cmp.Or(cfg.AMQP.Vhost, u.Vhost), cfg.Queue),
	}
	first, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	if err := cfg.checkBroker(first.conn.Properties); err != nil {
		first.kill()
		return nil, err
	}
	s.wg.Add(1)
	go s.supervise(bg, first)
	return s, nil
}

// Stats counts what a Source did since New. Every field only grows.
type Stats struct {
	// Reconnects is the number of times the connection or channel dropped
	// and consumption resumed on a new one.
	Reconnects uint64
	// StaleDropped is the number of deliveries of a dead channel dropped
	// before Receive returned them; the broker redelivers them.
	StaleDropped uint64
	// StaleSettles is the number of Ack, Retry and DeadLetter calls for
	// messages of a dead channel, which sent nothing, plus the
	// acknowledgements recorded by Ack that the channel closed before they
	// were sent; the broker redelivers those messages and deduplication
	// absorbs them.
	StaleSettles uint64
	// Acked is the number of deliveries whose acknowledgement was sent.
	Acked uint64
	// AckFrames is the number of basic.ack frames sent for them: one
	// multiple-ack covers every settled delivery of a contiguous run.
	AckFrames uint64
	// Unroutable is the number of dead-letter copies the broker returned
	// because the dead-letter destination does not exist.
	Unroutable uint64
	// Released is the number of deliveries handed back to their queue
	// (basic.reject with requeue) because their retry or dead-letter copy
	// could not be published.
	Released uint64
}

// Stats returns a snapshot of the source's counters. It is safe to call at
// any time from any goroutine.
func (s *Source) Stats() Stats {
	return Stats{
		Reconnects:   s.stats.reconnects.Load(),
		StaleDropped: s.stats.staleDropped.Load(),
		StaleSettles: s.stats.staleSettles.Load(),
		Unroutable:   s.stats.unroutable.Load(),
		Released:     s.stats.requeued.Load(),
		Acked:        s.stats.acked.Load(),
		AckFrames:    s.stats.ackFrames.Load(),
	}
}

// Receive blocks until at least one delivery is available, then returns up
// to max messages without waiting for more. It returns ctx.Err() when ctx is
// done and consumer.ErrClosed after Close. While the connection is down it
// waits for the reconnect. Deliveries of a channel that died before they were
// returned are dropped: the broker redelivers them.
func (s *Source) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	if s.isClosing() {
		return nil, consumer.ErrClosed
	}
	var out []*consumer.Message
	for len(out) == 0 {
		select {
		case <-s.closing:
			return nil, consumer.ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		case in := <-s.in:
			out = s.accept(out, in, time.Now())
		}
	}
	now := time.Now()
	for len(out) < max {
		select {
		case in := <-s.in:
			out = s.accept(out, in, now)
		default:
			return out, nil
		}
	}
	return out, nil
}

// accept appends in's message to out, unless in's channel died: the broker
// redelivers it.
func (s *Source) accept(out []*consumer.Message, in inbound, now time.Time) []*consumer.Message {
	if !in.sess.alive() {
		s.stats.staleDropped.Add(1)
		return out
	}
	return append(out, s.toMessage(in.sess, in.d, now))
}

// Ack acknowledges msgs on the channel each was delivered on, after their
// effects are durable. It records the acknowledgements and returns; a
// background loop per channel sends them, so that the acknowledgements of
// concurrent Ack calls share frames (see Config.AckHold), and a multiple-ack
// never covers a delivery that was not passed to Ack. Close sends every
// recorded acknowledgement before it closes the connection. Messages of a
// channel that has died since are not acknowledged
// (their tags are invalid); Ack then returns an error matching
// ErrStaleDelivery, which is harmless: the broker redelivers them and
// deduplication absorbs the redelivery. The same holds for a recorded
// acknowledgement whose channel dies before it is sent (counted in
// Stats.StaleSettles).
func (s *Source) Ack(ctx context.Context, msgs []*consumer.Message) error {
	if s.isClosing() {
		return consumer.ErrClosed
	}
	groups := make(map[*session][]uint64, 1) // a reconnect adds one
	var errs []error
	for _, m := range msgs {
		h, err := s.handleOf(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		groups[h.sess] = append(groups[h.sess], h.tag)
	}
	for sess, tags := range groups {
		if err := sess.ack(tags, true); err != nil {
			if errors.Is(err, ErrStaleDelivery) {
				s.stats.staleSettles.Add(uint64(len(tags)))
			}
			errs = append(errs, fmt.Errorf("amqpsource: ack %d message(s) of channel generation %d: %w", len(tags), sess.gen, err))
		}
	}
	return errors.Join(errs...)
}

// Retry publishes a copy of msg to the retry queue whose delay is the
// smallest of the ladder (100 ms … 1 h, then whole hours) not shorter than
// delay, waits for the broker's confirm, and only then acknowledges msg. The
// retry queue's message TTL dead-letters the copy back to the source queue,
// where it arrives with Attempt one higher. Retry queues are durable and
// declared on first use.
//
// If the copy cannot be published (the retry queue's declaration is refused,
// the broker nacks the copy or does not confirm it within
// Config.PublishTimeout, the publishing channel closes), msg is not
// acknowledged and Retry returns the error; msg is then handed back to its
// queue (basic.reject with requeue) after a hold, so that it neither keeps a
// prefetch slot nor loops hot: the longer of the retry delay and a backoff
// from 1 s that doubles while copies keep failing, at most
// Config.UnroutableDelay. msg may so come back before delay, without
// HeaderRetries increased. If the channel dies between the confirm and the
// acknowledgement, both the copy and the original come back; deduplication
// runs the handler at most once for them.
func (s *Source) Retry(ctx context.Context, msg *consumer.Message, delay time.Duration) error {
	if s.isClosing() {
		return consumer.ErrClosed
	}
	h, err := s.handleOf(msg)
	if err != nil {
		return err
	}
	err = s.retry(ctx, h, h.attempt, delay)
	if errors.Is(err, ErrStaleDelivery) {
		s.stats.staleSettles.Add(1)
	}
	return err
}

// retry publishes h's retry copy and acknowledges h. If the copy is not
// published, h is handed back to its queue after a hold (copyFailed).
func (s *Source) retry(ctx context.Context, h *handle, attempt int, delay time.Duration) error {
	bucket := retryBucket(delay)
	queue := s.cfg.RetryQueuePrefix + bucketName(bucket)
	p := copyOf(h.d)
	p.Headers[HeaderRetries] = int64(max(attempt, 1))

	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout) // or ctx's earlier deadline
	defer cancel()
	every, err := s.cfg.retryRedeclareEvery(bucket)
	if err != nil {
		return s.copyFailed(ctx, h, fmt.Errorf("amqpsource: retry: %w", err), bucket)
	}
	if err := h.sess.publish(ctx, "", queue, p, s.cfg.retryQueueArgs(bucket), every); err != nil {
		return s.copyFailed(ctx, h, fmt.Errorf("amqpsource: retry: %w", err), bucket)
	}
	s.copyFailures.Store(0)
	if err := h.sess.ack([]uint64{h.tag}, false); err != nil {
		return fmt.Errorf("amqpsource: retry: copy is in %q but the original was not acknowledged: %w", queue, err)
	}
	return nil
}

// DeadLetter publishes a copy of msg to Config.DeadLetterExchange with
// routing key Config.DeadLetterRoutingKey, with the reason in the
// consumer.MetaReason header and the attempt count, queue, key and time in
// the other Meta* headers, waits for the broker's confirm, and only then
// acknowledges msg. The reason (at most 4 KiB, a longer one ending with
// " ...(truncated)"), queue and key are written as internal/metatext.Clean
// makes them, the same text on every broker: characters outside the XML 1.0
// range and invalid UTF-8 become Go escapes (\x01).
//
// If the dead-letter destination does not exist (the broker returns the copy
// as unroutable, or the exchange is missing), msg goes to the retry queue for
// Config.UnroutableDelay instead, so it is neither lost nor looped hot, and
// DeadLetter returns an error matching ErrUnroutable. If the copy cannot be
// published at all, or cannot be parked either, msg is not acknowledged: it
// is handed back to its queue after a hold, as after a failed Retry.
func (s *Source) DeadLetter(ctx context.Context, msg *consumer.Message, reason error) error {
	if s.isClosing() {
		return consumer.ErrClosed
	}
	h, err := s.handleOf(msg)
	if err != nil {
		return err
	}
	if reason == nil {
		reason = errors.New("no reason given")
	}
	attempts, key := brokerkit.Recorded(reason, h.attempt, msg.Key)
	attempts = max(attempts, 1) // a dead letter counts one attempt at least
	p := copyOf(h.d)
	p.Headers[consumer.MetaReason] = brokerkit.ReasonText(reason, maxReasonBytes)
	p.Headers[consumer.MetaAttempts] = int64(attempts)
	p.Headers[MetaOriginQueue] = metatext.Clean(s.cfg.Queue, maxReasonBytes)
	p.Headers[consumer.MetaDeadLetteredAt] = time.Now().UTC().Format(time.RFC3339Nano)
	if key != "" {
		p.Headers[consumer.MetaKey] = metatext.Clean(key, consumer.MaxKeyBytes)
	}

	pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout) // or ctx's earlier deadline
	defer cancel()
	err = h.sess.publish(pctx, s.cfg.DeadLetterExchange, s.cfg.DeadLetterRoutingKey, p, nil, 0)
	switch {
	case errors.Is(err, ErrUnroutable):
		s.stats.unroutable.Add(1)
		s.log.ErrorContext(ctx, "dead-letter destination does not exist; message parked in a retry queue",
			"exchange", s.cfg.DeadLetterExchange, "routing_key", s.cfg.DeadLetterRoutingKey,
			consumer.LogKeyDelay, s.cfg.UnroutableDelay, consumer.LogKeyID, msg.ID)
		if perr := s.retry(ctx, h, attempts, s.cfg.UnroutableDelay); perr != nil {
			return errors.Join(fmt.Errorf("amqpsource: dead-letter: %w", err), perr)
		}
		return fmt.Errorf("amqpsource: dead-letter: %w; parked for %s", err, s.cfg.UnroutableDelay)
	case err != nil:
		if errors.Is(err, ErrStaleDelivery) {
			s.stats.staleSettles.Add(1)
		}
		return s.copyFailed(ctx, h, fmt.Errorf("amqpsource: dead-letter: %w", err), 0)
	}
	s.copyFailures.Store(0)
	if err := h.sess.ack([]uint64{h.tag}, false); err != nil {
		return fmt.Errorf("amqpsource: dead-letter: copy published but the original was not acknowledged: %w", err)
	}
	return nil
}

// copyFailed handles err, a retry or dead-letter copy of h that was not
// published. Unless h's channel is dead (the broker has requeued h then), it
// hands h back to its queue after a hold of floor or longer, at most
// Config.UnroutableDelay: left unacknowledged, h would keep a prefetch slot
// until the broker's consumer_timeout, and the hold keeps a copy that fails
// every time from looping hot (docs/sources.md, "A copy that fails").
func (s *Source) copyFailed(ctx context.Context, h *handle, err error, floor time.Duration) error {
	if errors.Is(err, ErrStaleDelivery) || !h.sess.alive() {
		return err
	}
	n := s.copyFailures.Add(1)
	backoff := consumer.RetryPolicy{
		InitialBackoff: time.Second, // doubles with each copy that fails in a row
		MaxBackoff:     s.cfg.UnroutableDelay,
		Multiplier:     2,
		Jitter:         0.2,
	}.Backoff(int(min(n, 32)))
	hold := min(max(floor, backoff), s.cfg.UnroutableDelay)
	s.handBackLater(context.WithoutCancel(ctx), h, hold)
	return fmt.Errorf("%w; the original returns to the queue in %s", err, hold.Round(time.Millisecond))
}

// handBackLater hands h back to its queue after hold, unless its channel
// dies first (the broker then requeues it itself). Until then h's tag stays
// pending, so that no multiple-ack covers it. Its log lines carry ctx.
func (s *Source) handBackLater(ctx context.Context, h *handle, hold time.Duration) {
	time.AfterFunc(hold, func() {
		sent, err := h.sess.requeue(h.tag)
		switch {
		case err != nil:
			s.log.WarnContext(ctx, "could not requeue a delivery whose copy failed; it returns when its channel closes",
				logKeyGeneration, h.sess.gen, consumer.LogKeyID, h.d.MessageId, consumer.LogKeyError, err)
		case sent:
			s.stats.requeued.Add(1)
			s.log.DebugContext(ctx, "delivery whose copy failed returned to the queue",
				logKeyGeneration, h.sess.gen, consumer.LogKeyID, h.d.MessageId, consumer.LogKeyDelay, hold)
		}
	})
}

// String names the source for logs (the Runner's start line): its broker's
// host and port, virtual host and queue, like "rabbitmq 127.0.0.1:5672
// vhost=/ queue=orders". It holds no user name or password.
func (s *Source) String() string { return s.desc }

// Close stops consuming and closes the connection. Messages received but not
// acknowledged, including those buffered in the client and not yet returned by
// Receive, go back to the queue (the broker requeues a closed channel's
// unacknowledged deliveries). Close is safe to call more than once and
// concurrently with the other methods, which then fail with
// consumer.ErrClosed. It waits for a connection attempt in progress, at most
// Config.ConnectTimeout.
func (s *Source) Close() error {
	s.once.Do(func() {
		s.stop()
		s.wg.Wait()
	})
	return nil
}

func (s *Source) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

func (s *Source) handleOf(m *consumer.Message) (*handle, error) {
	return brokerkit.Handle(m, ErrForeignMessage, func(h *handle) bool { return h.src == s })
}
