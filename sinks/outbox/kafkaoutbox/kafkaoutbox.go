// Package kafkaoutbox is the Kafka Publisher of an outbox.Relay, on
// segmentio/kafka-go.
//
// Each row becomes a message on the topic named by its Destination, keyed
// by its Key (so the rows of one key land on one partition, in order), with
// its headers and an "idempotency-key" header carrying the stable id: the
// header kafkasource reads by default, so a downstream idemq consumer
// deduplicates the relay's re-sends with no configuration. The writer waits
// for all in-sync replicas (RequiredAcks = RequireAll) before Publish
// reports a message sent. Topics are never created: a row for a missing
// topic fails with outbox.ErrNoDestination and is parked after the relay's
// MaxAttempts.
package kafkaoutbox

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/sinks/outbox"
)

// Config configures a Publisher.
type Config struct {
	// Brokers are the bootstrap addresses (host:port). Required.
	Brokers []string
	// Transport is the kafka-go transport (TLS, SASL). Defaults to a
	// transport of the Publisher's own whose metadata cache lives 1 s, so
	// that a topic created after the relay started is found quickly instead
	// of failing (and counting attempts) until kafka-go's default 6 s cache
	// expires.
	Transport kafka.RoundTripper
	// WriteTimeout bounds one produce request. Defaults to 10 s.
	WriteTimeout time.Duration
}

// Publisher publishes outbox rows to Kafka. It is safe for concurrent use.
type Publisher struct {
	w *kafka.Writer
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a Publisher. Close it when done.
func New(cfg Config) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, &idemq.ConfigError{Field: "kafkaoutbox.Config.Brokers", Reason: "required"}
	}
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, 10*time.Second)
	cfg.Transport = cmp.Or[kafka.RoundTripper](cfg.Transport, &kafka.Transport{MetadataTTL: time.Second})
	return &Publisher{w: &kafka.Writer{
		Addr:                   kafka.TCP(cfg.Brokers...),
		Transport:              cfg.Transport,
		Balancer:               kafka.Murmur2Balancer{},
		RequiredAcks:           kafka.RequireAll,
		AllowAutoTopicCreation: false,
		MaxAttempts:            1, // the relay retries, with backoff
		BatchSize:              1000,
		BatchTimeout:           time.Millisecond,
		BatchBytes:             16 << 20,
		WriteTimeout:           cfg.WriteTimeout,
		ReadTimeout:            cfg.WriteTimeout,
	}}, nil
}

// Publish writes msgs, one produce call per topic, and returns once every
// message was acknowledged by all in-sync replicas (nil) or with an
// *outbox.BatchError.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) error {
	return outbox.PublishByDestination(msgs, func(group []outbox.Message) error {
		km := make([]kafka.Message, len(group))
		for i, m := range group {
			km[i] = toKafka(m)
		}
		err := p.w.WriteMessages(ctx, km...)
		var werrs kafka.WriteErrors
		if errors.As(err, &werrs) && len(werrs) == len(group) {
			errs := make([]error, len(group))
			for i, err := range werrs {
				errs[i] = classify(err)
			}
			return outbox.BatchResult(errs)
		}
		return classify(err)
	})
}

// toKafka converts a row to a Kafka message; its headers go in name order.
func toKafka(m outbox.Message) kafka.Message {
	km := kafka.Message{Topic: m.Destination, Value: m.Body}
	if m.Key != "" {
		km.Key = []byte(m.Key)
	}
	km.Headers = []kafka.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte(m.ID)}}
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		if k != outbox.HeaderIdempotencyKey {
			km.Headers = append(km.Headers, kafka.Header{Key: k, Value: []byte(m.Headers[k])})
		}
	}
	return km
}

// classify marks err as an outage or a missing destination.
//
// A broker's error code (kafka.Error) is classified before the connection
// errors: kafka.Error has Timeout and Temporary methods, so it satisfies
// net.Error and would pass for a connection error, which would make a
// message the broker refuses for good (too large, invalid) an outage that
// is retried forever and never parked.
func classify(err error) error {
	var ke kafka.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kafka.UnknownTopicOrPartition), errors.Is(err, kafka.InvalidTopic):
		return outbox.NoDestination(err)
	case errors.As(err, &ke):
		if ke.Temporary() {
			return outbox.Unavailable(err) // leader election, not enough replicas...
		}
		return err
	case outbox.IsConnectionError(err):
		return outbox.Unavailable(err)
	}
	return err
}

// Close flushes and closes the writer.
func (p *Publisher) Close() error { return p.w.Close() }
