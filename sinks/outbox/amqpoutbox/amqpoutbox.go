// Package amqpoutbox is the RabbitMQ Publisher of an outbox.Relay, on
// amqp091-go.
//
// Each row is published persistent and mandatory to the exchange named by
// its Destination ("" is the default exchange) with its Key as the routing
// key, its headers, and the stable id as the message-id property and the
// "idempotency-key" header, which amqpsource reads (header first, then
// message-id), so a downstream idemq consumer deduplicates the relay's
// re-sends with no configuration. The channel is in confirm mode: a row is
// reported sent only after the broker's ack. A message the broker returns
// as unroutable (mandatory) and a missing exchange (checked passively
// before the first publish to it) fail with outbox.ErrNoDestination.
//
// Known limit: an exchange is checked once per connection. If it is deleted
// afterwards, the broker closes the channel on the next publish to it; the
// Publisher reports that as an outage (outbox.ErrUnavailable), reconnects
// and checks again, so the row is counted and parked from the next batch
// on, but the other rows of the failing batch are re-sent.
package amqpoutbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sinks/outbox"
)

// Config configures a Publisher.
type Config struct {
	// URL is the AMQP 0-9-1 URL (amqp://user:pass@host:5672/vhost).
	// Required.
	URL string
	// ConfirmTimeout bounds the wait for the broker's confirms of one
	// batch. Defaults to 30 s.
	ConfirmTimeout time.Duration
}

// Publisher publishes outbox rows to RabbitMQ through one connection and
// one confirm-mode channel, dialled on first use and again after it
// breaks. It is safe for concurrent use; publishes are serialised.
type Publisher struct {
	cfg Config

	mu        sync.Mutex
	conn      *amqp.Connection
	ch        *amqp.Channel
	returns   chan amqp.Return
	exchanges map[string]bool // exchanges known to exist on conn
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a Publisher. Close it when done.
func New(cfg Config) (*Publisher, error) {
	if cfg.URL == "" {
		return nil, &consumer.ConfigError{Field: "amqpoutbox.Config.URL", Reason: "required"}
	}
	if cfg.ConfirmTimeout == 0 {
		cfg.ConfirmTimeout = 30 * time.Second
	}
	return &Publisher{cfg: cfg}, nil
}

// connect dials when there is no open channel. Callers hold mu.
func (p *Publisher) connect() error {
	if p.ch != nil && !p.ch.IsClosed() && p.conn != nil && !p.conn.IsClosed() {
		return nil
	}
	p.closeLocked()
	conn, err := amqp.Dial(p.cfg.URL)
	if err != nil {
		return outbox.Unavailable(fmt.Errorf("amqpoutbox: dial: %w", err))
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close() // the channel's error is the one to report
		return outbox.Unavailable(fmt.Errorf("amqpoutbox: channel: %w", err))
	}
	if err := ch.Confirm(false); err != nil {
		_ = conn.Close() // the confirm mode's error is the one to report
		return outbox.Unavailable(fmt.Errorf("amqpoutbox: confirm mode: %w", err))
	}
	p.conn, p.ch = conn, ch
	p.returns = ch.NotifyReturn(make(chan amqp.Return, 1024))
	p.exchanges = map[string]bool{"": true}
	return nil
}

// exchangeExists checks name passively on a throwaway channel (a missing
// exchange closes the channel it was checked on). Callers hold mu.
func (p *Publisher) exchangeExists(name string) error {
	if p.exchanges[name] {
		return nil
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return outbox.Unavailable(fmt.Errorf("amqpoutbox: channel: %w", err))
	}
	defer ch.Close()
	if err := ch.ExchangeDeclarePassive(name, "direct", false, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return outbox.NoDestination(fmt.Errorf("amqpoutbox: exchange %q: %w", name, err))
		}
		return outbox.Unavailable(fmt.Errorf("amqpoutbox: check exchange %q: %w", name, err))
	}
	p.exchanges[name] = true
	return nil
}

// Publish publishes msgs and returns once the broker confirmed every one of
// them (nil) or with an *outbox.BatchError.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.connect(); err != nil {
		return err
	}
	errs := make([]error, len(msgs))
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	byID := make(map[string]int, len(msgs))
	broken := false
	for i, m := range msgs {
		if broken {
			errs[i] = outbox.Unavailable(errors.New("amqpoutbox: channel closed"))
			continue
		}
		if err := p.exchangeExists(m.Destination); err != nil {
			errs[i] = err
			continue
		}
		headers := make(amqp.Table, len(m.Headers)+1)
		for k, v := range m.Headers {
			headers[k] = v
		}
		headers[outbox.HeaderIdempotencyKey] = m.ID
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, m.Destination, m.Key, true, false, amqp.Publishing{
			MessageId:    m.ID,
			Headers:      headers,
			DeliveryMode: amqp.Persistent,
			Timestamp:    time.Now(),
			Body:         m.Body,
		})
		if err != nil {
			errs[i] = outbox.Unavailable(fmt.Errorf("amqpoutbox: publish: %w", err))
			broken = true
			continue
		}
		confirms[i] = dc
		byID[m.ID] = i
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
	defer cancel()
	for i, dc := range confirms {
		if dc == nil {
			continue
		}
		ok, err := dc.WaitContext(wctx)
		switch {
		case err != nil:
			errs[i] = outbox.Unavailable(fmt.Errorf("amqpoutbox: wait for confirm: %w", err))
			broken = true
		case !ok:
			errs[i] = errors.New("amqpoutbox: broker nacked the message")
		}
	}
	// A mandatory message that routed nowhere is returned before its ack,
	// so every return of this batch is in the channel by now.
	for drained := false; !drained; {
		select {
		case r := <-p.returns:
			if i, ok := byID[r.MessageId]; ok {
				errs[i] = outbox.NoDestination(fmt.Errorf("amqpoutbox: returned by the broker: %d %s (exchange %q, routing key %q)",
					r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey))
			}
		default:
			drained = true
		}
	}
	if broken {
		p.closeLocked()
	}
	for _, err := range errs {
		if err != nil {
			return &outbox.BatchError{Errs: errs}
		}
	}
	return nil
}

func (p *Publisher) closeLocked() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.ch, p.returns = nil, nil, nil
}

// Close closes the connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLocked()
	return nil
}
