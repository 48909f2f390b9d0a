package checkout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/sources/kafkasource"
)

// Broker kinds accepted by BrokerConfig.Kind.
const (
	BrokerMemory   = "memory"
	BrokerKafka    = "kafka"
	BrokerSQS      = "sqs"
	BrokerRabbitMQ = "rabbitmq"
)

// KeyHeader is the header (Kafka, RabbitMQ) or message attribute (SQS) that
// carries an order's idempotency key, its Order.ID.
const KeyHeader = "idempotency-key"

// BrokerConfig says which broker carries the orders and where it is.
type BrokerConfig struct {
	// Kind is BrokerMemory, BrokerKafka, BrokerSQS or BrokerRabbitMQ.
	// Required.
	Kind string
	// Memory is the in-process broker of BrokerMemory. Defaults to a new
	// memsource.Broker with a 5 s visibility timeout.
	Memory *memsource.Broker
	// KafkaBrokers are the Kafka bootstrap addresses. Required for
	// BrokerKafka.
	KafkaBrokers []string
	// KafkaSessionTimeout is the consumer group's session timeout: how long
	// the partitions of a killed worker stall before a restarted worker
	// takes them over. Defaults to 10 s (kafkasource's default is 30 s).
	KafkaSessionTimeout time.Duration
	// KafkaRebalanceTimeout is how long the group coordinator waits for
	// every member to rejoin during a rebalance; a killed member never
	// does. Defaults to 3 × KafkaSessionTimeout.
	KafkaRebalanceTimeout time.Duration
	// AMQPURL is the RabbitMQ URL. Required for BrokerRabbitMQ.
	AMQPURL string
	// SQSEndpoint is the SQS endpoint, for a local SQS-compatible server;
	// empty means AWS through the default configuration chain.
	SQSEndpoint string
	// Topic is the Kafka topic, the SQS queue or the RabbitMQ queue.
	// Defaults to "checkout-orders".
	Topic string
	// Partitions is the number of partitions of the Kafka topic, when it is
	// created. Defaults to 4.
	Partitions int
	// Group is the Kafka consumer group. Defaults to "checkout".
	Group string
	// Logger receives the source's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c BrokerConfig) WithDefaults() BrokerConfig {
	if c.Kind == BrokerMemory && c.Memory == nil {
		c.Memory = memsource.New(memsource.Config{VisibilityTimeout: 5 * time.Second})
	}
	if c.KafkaSessionTimeout == 0 {
		c.KafkaSessionTimeout = 10 * time.Second
	}
	if c.KafkaRebalanceTimeout == 0 {
		c.KafkaRebalanceTimeout = 3 * c.KafkaSessionTimeout
	}
	if c.Topic == "" {
		c.Topic = "checkout-orders"
	}
	if c.Partitions == 0 {
		c.Partitions = 4
	}
	if c.Group == "" {
		c.Group = "checkout"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Outgoing is an order message to publish.
type Outgoing struct {
	// Key is the idempotency key (the order's ID), sent in KeyHeader.
	Key string
	// Body is the payload: an Order as JSON, or anything for bad input.
	Body []byte
	// PartitionKey orders the messages of one account: the Kafka message
	// key, the "account" attribute or header.
	PartitionKey string
}

// Broker is one of the brokers the worker runs on: it opens Sources for the
// worker and publishes orders for the producer. It is safe for concurrent
// use.
type Broker interface {
	// Source opens a consumer.Source on the orders topic or queue. rc is
	// the runner configuration the source will serve; Source may set its
	// KeyFunc.
	Source(ctx context.Context, rc *consumer.Config) (consumer.Source, error)
	// Publish sends msgs, durably when it returns.
	Publish(ctx context.Context, msgs ...Outgoing) error
	// Close releases the producer's connections.
	Close() error
}

// ErrUnknownBroker is returned by OpenBroker for an unknown BrokerConfig.Kind.
var ErrUnknownBroker = errors.New("checkout: unknown broker")

// OpenBroker prepares the broker of cfg: it creates the topic or queue and
// its dead-letter destination if missing and connects the producer.
func OpenBroker(ctx context.Context, cfg BrokerConfig) (Broker, error) {
	cfg = cfg.WithDefaults()
	switch cfg.Kind {
	case BrokerMemory:
		return &memBroker{cfg: cfg}, nil
	case BrokerKafka:
		return openKafka(ctx, cfg)
	case BrokerSQS:
		return openSQS(ctx, cfg)
	case BrokerRabbitMQ:
		return openRabbitMQ(cfg)
	}
	return nil, fmt.Errorf("%w %q (known: %s, %s, %s, %s)", ErrUnknownBroker, cfg.Kind, BrokerMemory, BrokerKafka, BrokerSQS, BrokerRabbitMQ)
}

type memBroker struct{ cfg BrokerConfig }

func (b *memBroker) Source(context.Context, *consumer.Config) (consumer.Source, error) {
	return b.cfg.Memory.Source(b.cfg.Topic), nil
}

func (b *memBroker) Publish(_ context.Context, msgs ...Outgoing) error {
	out := make([]memsource.Outgoing, len(msgs))
	for i, m := range msgs {
		out[i] = memsource.Outgoing{Key: m.Key, Body: m.Body, PartitionKey: m.PartitionKey}
	}
	b.cfg.Memory.Publish(b.cfg.Topic, out...)
	return nil
}

func (b *memBroker) Close() error { return nil }

type kafkaBroker struct {
	cfg BrokerConfig
	w   *kafka.Writer
}

func openKafka(ctx context.Context, cfg BrokerConfig) (*kafkaBroker, error) {
	if len(cfg.KafkaBrokers) == 0 {
		return nil, fmt.Errorf("checkout: kafka: no bootstrap brokers")
	}
	if err := kafkasource.CreateTopics(ctx, nil, cfg.KafkaBrokers,
		kafkasource.TopicSpec{Name: cfg.Topic, Partitions: cfg.Partitions},
		kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(cfg.Topic), Partitions: 1},
	); err != nil {
		return nil, fmt.Errorf("checkout: kafka: %w", err)
	}
	return &kafkaBroker{cfg: cfg, w: &kafka.Writer{
		Addr:         kafka.TCP(cfg.KafkaBrokers...),
		Topic:        cfg.Topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 2 * time.Millisecond,
		Transport:    &kafka.Transport{}, // fresh metadata: the topic may be new
	}}, nil
}

func (b *kafkaBroker) Source(ctx context.Context, _ *consumer.Config) (consumer.Source, error) {
	return kafkasource.New(ctx, kafkasource.Config{
		Brokers:           b.cfg.KafkaBrokers,
		Topics:            []string{b.cfg.Topic},
		GroupID:           b.cfg.Group,
		KeyHeader:         KeyHeader,
		SessionTimeout:    b.cfg.KafkaSessionTimeout,
		HeartbeatInterval: max(b.cfg.KafkaSessionTimeout/10, 100*time.Millisecond),
		RebalanceTimeout:  b.cfg.KafkaRebalanceTimeout,
		JoinGroupBackoff:  500 * time.Millisecond,
		MaxWait:           250 * time.Millisecond,
		Logger:            b.cfg.Logger,
	})
}

func (b *kafkaBroker) Publish(ctx context.Context, msgs ...Outgoing) error {
	out := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		out[i] = kafka.Message{Key: []byte(m.PartitionKey), Value: m.Body,
			Headers: []kafka.Header{{Key: KeyHeader, Value: []byte(m.Key)}}}
	}
	return b.w.WriteMessages(ctx, out...)
}

func (b *kafkaBroker) Close() error { return b.w.Close() }
