// Package amqpoutbox is the RabbitMQ Publisher of an outbox.Relay, on
// amqp091-go.
//
// Each row is published persistent and mandatory to the exchange named by
// its Destination ("" is the default exchange), routed by its RoutingKey
// (else its Key), with its headers, and with the stable id as its
// message-id property and its "idempotency-key" header, which amqpsource
// reads, so a downstream idemq consumer deduplicates the relay's re-sends
// with no configuration. A row whose headers hold
// consumer.HeaderCorrelationID (a reply written by outbox.Reply) also
// carries it as its correlation_id property.
//
// A row is reported sent only after the broker's ack. A message the broker
// returns as unroutable and a missing exchange (checked passively before
// the first publish to it) fail with outbox.ErrNoDestination; a nacked
// message fails with an attempt counted; a channel that closes before a
// message's confirm, or a confirm that does not come within
// ConfirmTimeout, fails it as an outage (outbox.ErrUnavailable).
//
// Known limit: an exchange is checked once per connection. If it is deleted
// afterwards, the broker closes the channel on the next publish to it; the
// Publisher reports that batch as an outage, drops the channel and checks
// the exchanges again on the next call, so the row is counted and parked
// from the next batch on, but the other rows of the failing batch are
// re-sent.
package amqpoutbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/redact"
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

// Publisher publishes outbox rows to RabbitMQ through one connection,
// dialled on first use and again after it breaks. Each Publish takes a
// confirm-mode channel of its own (opened when none is free, kept for the
// next call), so concurrent calls (a relay's Concurrency, several relays
// sharing the Publisher) publish and wait for their confirms in parallel.
// It is safe for concurrent use.
type Publisher struct {
	cfg Config

	mu        sync.Mutex
	conn      *amqp.Connection
	idle      []*confirmChannel // channels of conn no Publish uses
	exchanges map[string]bool   // exchanges known to exist on conn
}

// confirmChannel is a confirm-mode channel and the returns it receives.
type confirmChannel struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a Publisher. Close it when done. It fails with a
// *idemq.ConfigError if cfg.URL is empty or is not an AMQP URL (the error
// shows the URL redacted); it does not connect.
func New(cfg Config) (*Publisher, error) {
	if cfg.URL == "" {
		return nil, &idemq.ConfigError{Field: "amqpoutbox.Config.URL", Reason: "required"}
	}
	if _, err := url.Parse(cfg.URL); err != nil {
		// url.Parse's error quotes the whole URL, password included, and
		// amqp.ParseURI's quotes it before it can be redacted.
		return nil, &idemq.ConfigError{Field: "amqpoutbox.Config.URL", Err: redact.URLError(err)}
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return nil, &idemq.ConfigError{Field: "amqpoutbox.Config.URL", Err: err}
	}
	cfg.ConfirmTimeout = cmp.Or(cfg.ConfirmTimeout, 30*time.Second)
	return &Publisher{cfg: cfg}, nil
}

// acquire returns a free channel of the connection, dialling when the
// connection is closed and opening a channel when none is free.
func (p *Publisher) acquire() (*confirmChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil || p.conn.IsClosed() {
		p.closeLocked()
		conn, err := amqp.Dial(p.cfg.URL)
		if err != nil {
			return nil, outbox.Unavailable(fmt.Errorf("amqpoutbox: dial: %w", err))
		}
		p.conn = conn
		p.exchanges = map[string]bool{"": true}
	}
	for len(p.idle) > 0 {
		cc := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if !cc.ch.IsClosed() {
			return cc, nil
		}
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, outbox.Unavailable(fmt.Errorf("amqpoutbox: channel: %w", err))
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close() // the confirm mode's error is the one to report
		return nil, outbox.Unavailable(fmt.Errorf("amqpoutbox: confirm mode: %w", err))
	}
	return &confirmChannel{conn: p.conn, ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1024))}, nil
}

// release gives cc back for the next Publish, or closes it when it broke
// (a broken channel may be a deleted exchange: the exchanges are checked
// again) or belongs to a closed connection.
func (p *Publisher) release(cc *confirmChannel, broken bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if broken || cc.conn != p.conn || cc.ch.IsClosed() {
		_ = cc.ch.Close()
		if cc.conn == p.conn {
			p.exchanges = map[string]bool{"": true}
		}
		return
	}
	p.idle = append(p.idle, cc)
}

// checkExchanges returns, for each destination of msgs not known to exist
// on conn, nil once checked or the error of its check.
func (p *Publisher) checkExchanges(conn *amqp.Connection, msgs []outbox.Message) map[string]error {
	out := map[string]error{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		if _, done := out[m.Destination]; done || p.exchanges[m.Destination] && conn == p.conn {
			continue
		}
		err := exchangeExists(conn, m.Destination)
		if err == nil && conn == p.conn {
			p.exchanges[m.Destination] = true
		}
		out[m.Destination] = err
	}
	return out
}

// exchangeExists checks name passively on a throwaway channel (a missing
// exchange closes the channel it was checked on).
func exchangeExists(conn *amqp.Connection, name string) error {
	if name == "" {
		return nil
	}
	ch, err := conn.Channel()
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
	return nil
}

// Publish publishes msgs on a channel of its own, all of them before it
// waits for the first confirm, and returns once the broker confirmed every
// one of them (nil) or with an *outbox.BatchError (see the package's
// outcomes).
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) error {
	cc, err := p.acquire()
	if err != nil {
		return err
	}
	checked := p.checkExchanges(cc.conn, msgs)
	errs := make([]error, len(msgs))
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	byID := make(map[string]int, len(msgs))
	broken := false
	// A mandatory message that routed nowhere is returned before its ack.
	// Returns are read while publishing and while waiting: amqp091-go's
	// reader blocks on a full returns buffer and drops the return after
	// 5 s, and its message's ack would then read as a confirmation.
	returns := cc.returns
	onReturn := func(r amqp.Return, ok bool) {
		if !ok {
			returns = nil // the channel closed
			return
		}
		if i, ok := byID[r.MessageId]; ok {
			errs[i] = outbox.NoDestination(fmt.Errorf("amqpoutbox: returned by the broker: %d %s (exchange %q, routing key %q)",
				r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey))
		}
	}
	drainReturns := func() {
		for returns != nil {
			select {
			case r, ok := <-returns:
				onReturn(r, ok)
			default:
				return
			}
		}
	}
	now := time.Now()
	for i, m := range msgs {
		if broken {
			errs[i] = outbox.Unavailable(errors.New("amqpoutbox: channel closed"))
			continue
		}
		if err := checked[m.Destination]; err != nil {
			errs[i] = err
			continue
		}
		headers := make(amqp.Table, len(m.Headers)+1)
		for k, v := range m.Headers {
			headers[k] = v
		}
		headers[outbox.HeaderIdempotencyKey] = m.ID
		dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, m.Destination, cmp.Or(m.RoutingKey, m.Key), true, false, amqp.Publishing{
			MessageId:     m.ID,
			CorrelationId: m.Headers[consumer.HeaderCorrelationID], // a reply's (outbox.Reply)
			Headers:       headers,
			DeliveryMode:  amqp.Persistent,
			Timestamp:     now,
			Body:          m.Body,
		})
		if err != nil {
			errs[i] = outbox.Unavailable(fmt.Errorf("amqpoutbox: publish: %w", err))
			broken = true
			continue
		}
		confirms[i] = dc
		byID[m.ID] = i
		drainReturns()
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
	defer cancel()
	for i, dc := range confirms {
		if dc == nil {
			continue
		}
		for !isDone(dc) && wctx.Err() == nil {
			select {
			case <-dc.Done():
			case r, ok := <-returns:
				onReturn(r, ok)
			case <-wctx.Done():
			}
		}
		switch {
		case dc.Acked():
		case !isDone(dc):
			errs[i] = outbox.Unavailable(fmt.Errorf("amqpoutbox: wait for confirm: %w", wctx.Err()))
			broken = true
		case cc.ch.IsClosed():
			// The channel closed before the broker confirmed; amqp091-go
			// then ends the wait unconfirmed. Not the message's fault.
			errs[i] = outbox.Unavailable(errors.New("amqpoutbox: channel closed before the broker confirmed"))
			broken = true
		case errs[i] == nil:
			errs[i] = errors.New("amqpoutbox: broker nacked the message")
		}
	}
	drainReturns()
	p.release(cc, broken)
	return outbox.BatchResult(errs)
}

// isDone reports whether the broker's confirm (or the channel's close)
// ended dc's wait.
func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}

func (p *Publisher) closeLocked() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.idle, p.exchanges = nil, nil, nil
}

// Close closes the connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLocked()
	return nil
}
