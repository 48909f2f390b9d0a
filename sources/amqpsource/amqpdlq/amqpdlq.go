// Package amqpdlq is the dlq.Broker of a RabbitMQ dead-letter queue
// (amqpsource.DeadLetterQueue: the queue bound to the dead-letter exchange).
//
// A scan takes the dead letters with basic.get and manual acknowledgement,
// so no other consumer of the dead-letter queue sees them meanwhile, and
// hands the ones it keeps back to the queue when it ends (or when its
// connection dies). A replay publishes the copy to the origin queue through
// the default exchange, mandatory and with publisher confirms, and
// acknowledges the dead letter only after the broker confirmed the copy; if
// the process dies between the two, the broker requeues the dead letter and
// the next replay sends it again, which the runner absorbs as a duplicate of
// its key.
package amqpdlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/internal/brokerkit"
)

// Config configures a Broker.
type Config struct {
	// URL is the AMQP URI of the broker. Required.
	URL string
	// Queue is the dead-letter queue. Required.
	Queue string
	// AMQP is passed to amqp091.DialConfig (TLS, SASL, vhost).
	AMQP amqp.Config
	// KeyHeader is the header holding the deduplication key
	// (amqpsource.Config.KeyHeader), read when the dead letter has no
	// consumer.MetaKey. Defaults to amqpsource.DefaultKeyHeader.
	KeyHeader string
	// PublishTimeout bounds the wait for a replayed copy's confirm.
	// Defaults to 10 s.
	PublishTimeout time.Duration
}

// Broker reads and replays one RabbitMQ dead-letter queue. It is not safe
// for concurrent use.
type Broker struct {
	cfg Config
}

var _ dlq.Broker = (*Broker)(nil)

// New returns a Broker of cfg.Queue. It connects at each Scan.
func New(cfg Config) (*Broker, error) {
	l := cfgerr.List{Prefix: "amqpdlq.Config."}
	if cfg.URL == "" {
		l.Add("URL", "required")
	}
	if cfg.Queue == "" {
		l.Add("Queue", "required")
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	cfg.KeyHeader = cmp.Or(cfg.KeyHeader, amqpsource.DefaultKeyHeader)
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 10 * time.Second
	}
	return &Broker{cfg: cfg}, nil
}

// Close does nothing: each Scan closes its connection.
func (b *Broker) Close() error { return nil }

// ErrUnroutable reports a replayed copy that the broker could not route:
// the origin queue does not exist. The dead letter stays.
var ErrUnroutable = errors.New("amqpdlq: the origin queue does not exist")

// Scan implements dlq.Broker, in the dead-letter queue's order, visiting at
// most as many dead letters as the queue held when Scan began.
func (b *Broker) Scan(ctx context.Context, visit func(*dlq.Letter) dlq.Action) (int, error) {
	conn, err := amqp.DialConfig(b.cfg.URL, b.cfg.AMQP)
	if err != nil {
		return 0, fmt.Errorf("amqpdlq: connect: %w", err)
	}
	defer conn.Close() // requeues every dead letter kept
	get, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("amqpdlq: channel: %w", err)
	}
	q, err := get.QueueDeclarePassive(b.cfg.Queue, false, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("amqpdlq: dead-letter queue %q: %w", b.cfg.Queue, err)
	}
	pub, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("amqpdlq: channel: %w", err)
	}
	if err := pub.Confirm(false); err != nil {
		return 0, fmt.Errorf("amqpdlq: publisher confirms: %w", err)
	}
	returns := pub.NotifyReturn(make(chan amqp.Return, 1))
	// The dead letters kept go back to the queue before Scan returns, so
	// that the next scan finds them: a rejection of all of them, then a
	// wait (waitCounted) until the queue counts them again. A
	// quorum queue applies the rejection after it confirmed the channel's
	// close, and a connection closed with them unacknowledged requeues them
	// later still.
	var held uint64 // the highest delivery tag kept
	kept := 0
	defer func() {
		if held == 0 {
			return
		}
		_ = get.Nack(held, true, true)
		_ = get.Close()
		waitCounted(conn, b.cfg.Queue, kept)
	}()
	done := 0
	for i := 1; i <= q.Messages; i++ {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		d, ok, err := get.Get(b.cfg.Queue, false)
		if err != nil {
			return done, fmt.Errorf("amqpdlq: get from %q: %w", b.cfg.Queue, err)
		}
		if !ok {
			return done, nil
		}
		l := b.letterOf(d)
		switch visit(l) {
		case dlq.ActionReplay:
			if err := b.replay(ctx, pub, returns, d, l); err != nil {
				held, kept = d.DeliveryTag, kept+1
				return done, err
			}
			fallthrough
		case dlq.ActionPurge:
			if err := d.Ack(false); err != nil {
				return done, fmt.Errorf("amqpdlq: remove dead letter %s (a replayed copy is sent again by the next replay): %w", l.ID, err)
			}
			done++
		case dlq.ActionStop:
			held, kept = d.DeliveryTag, kept+1
			return done, nil
		default:
			held, kept = d.DeliveryTag, kept+1
		}
	}
	return done, nil
}

// waitCounted waits, at most 5 s, until queue holds at least n messages
// ready: the dead letters a scan kept are counted in their queue again.
func waitCounted(conn *amqp.Connection, queue string, n int) {
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = brokerkit.Poll(ctx, 20*time.Millisecond, func() (bool, error) {
		q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
		return err != nil || q.Messages >= n, nil
	})
}

// replay publishes the copy of d to its origin queue and waits for the
// broker's confirm. The copy has no user-id property, as amqpsource's own
// copies (copyOf): the broker refuses a user-id other than the connection's
// user, and a dead letter another user published carries that user's.
func (b *Broker) replay(ctx context.Context, pub *amqp.Channel, returns <-chan amqp.Return, d amqp.Delivery, l *dlq.Letter) error {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if !isMeta(k) {
			headers[k] = v
		}
	}
	p := amqp.Publishing{
		Headers: headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.Priority, CorrelationId: d.CorrelationId,
		ReplyTo: d.ReplyTo, MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type,
		AppId: d.AppId, Body: d.Body,
	}
	pctx, cancel := context.WithTimeout(ctx, b.cfg.PublishTimeout)
	defer cancel()
	dc, err := pub.PublishWithDeferredConfirmWithContext(pctx, "", l.Origin, true, false, p)
	if err != nil {
		return fmt.Errorf("amqpdlq: replay %s to %q (the dead letter stays): %w", l.ID, l.Origin, err)
	}
	acked, err := dc.WaitContext(pctx)
	if err != nil {
		return fmt.Errorf("amqpdlq: replay %s to %q: no confirm (the dead letter stays): %w", l.ID, l.Origin, err)
	}
	if !acked {
		return fmt.Errorf("amqpdlq: replay %s to %q: the broker refused the copy (the dead letter stays)", l.ID, l.Origin)
	}
	select {
	case r := <-returns:
		return fmt.Errorf("%w: replay %s to %q returned: %s (the dead letter stays)", ErrUnroutable, l.ID, l.Origin, r.ReplyText)
	default:
	}
	return nil
}

// isMeta reports whether k is a header that amqpsource.DeadLetter or the
// broker's dead-lettering adds.
func isMeta(k string) bool {
	switch k {
	case consumer.MetaReason, consumer.MetaAttempts, amqpsource.MetaOriginQueue, consumer.MetaKey,
		consumer.MetaDeadLetteredAt, amqpsource.HeaderRetries, "x-death", "x-delivery-count":
		return true
	}
	return strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

// digestID is the ID of a dead letter without a MessageId: the digest of
// its body and headers, but x-delivery-count, which a quorum queue raises
// at each scan that hands it back.
func digestID(d amqp.Delivery) string {
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		if k != "x-delivery-count" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	parts := make([][]byte, 0, 2*len(keys)+1)
	for _, k := range keys {
		parts = append(parts, []byte(k), fmt.Appendf(nil, "%T %v", d.Headers[k], d.Headers[k]))
	}
	return dlq.DigestID(append(parts, d.Body)...)
}

// letterOf describes d.
func (b *Broker) letterOf(d amqp.Delivery) *dlq.Letter {
	str := func(k string) string {
		switch v := d.Headers[k].(type) {
		case string:
			return v
		case []byte:
			return string(v)
		case int64, int32, int, int16, int8:
			return fmt.Sprint(v)
		}
		return ""
	}
	l := brokerkit.Letter(d.MessageId, d.Body, str)
	l.Reason = amqpsource.DeadLetterReason(d.Headers)
	l.Origin = cmp.Or(str(amqpsource.MetaOriginQueue), str("x-first-death-queue"))
	l.Key = cmp.Or(l.Key, str(b.cfg.KeyHeader), d.MessageId)
	if l.ID == "" {
		l.ID = digestID(d)
	}
	for k := range d.Headers {
		if !isMeta(k) {
			if v := str(k); v != "" {
				l.Headers[k] = v
			}
		}
	}
	return l
}
