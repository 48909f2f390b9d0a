package checkout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/memsource"
	"github.com/idemq/idemq/sources/sqssource"
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
	return nil, fmt.Errorf("%w %q (want %s, %s, %s or %s)", ErrUnknownBroker, cfg.Kind, BrokerMemory, BrokerKafka, BrokerSQS, BrokerRabbitMQ)
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

func (b *kafkaBroker) Source(_ context.Context, _ *consumer.Config) (consumer.Source, error) {
	return kafkasource.New(kafkasource.Config{
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

type sqsBroker struct {
	cfg              BrokerConfig
	client           *sqs.Client
	queueURL, dlqURL string
}

func openSQS(ctx context.Context, cfg BrokerConfig) (*sqsBroker, error) {
	var opts []func(*config.LoadOptions) error
	if cfg.SQSEndpoint != "" { // a local emulator accepts any credentials
		opts = append(opts, config.WithRegion("us-east-1"),
			config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("local", "local", "")))
	}
	client, err := sqssource.NewClient(ctx, cfg.SQSEndpoint, opts...)
	if err != nil {
		return nil, fmt.Errorf("checkout: sqs: %w", err)
	}
	b := &sqsBroker{cfg: cfg, client: client}
	for name, url := range map[string]*string{cfg.Topic: &b.queueURL, cfg.Topic + "-dlq": &b.dlqURL} {
		out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
		if err != nil {
			return nil, fmt.Errorf("checkout: sqs: create queue %s: %w", name, err)
		}
		*url = aws.ToString(out.QueueUrl)
	}
	return b, nil
}

func (b *sqsBroker) Source(ctx context.Context, _ *consumer.Config) (consumer.Source, error) {
	return sqssource.New(ctx, b.client, sqssource.Config{
		QueueURL:              b.queueURL,
		DeadLetterQueueURL:    b.dlqURL,
		KeyAttribute:          KeyHeader,
		PartitionKeyAttribute: "account",
		Logger:                b.cfg.Logger,
	})
}

func (b *sqsBroker) Publish(ctx context.Context, msgs ...Outgoing) error {
	for len(msgs) > 0 {
		n := min(len(msgs), sqssource.MaxBatch)
		entries := make([]sqstypes.SendMessageBatchRequestEntry, n)
		for i, m := range msgs[:n] {
			attrs := map[string]sqstypes.MessageAttributeValue{
				KeyHeader: {DataType: aws.String("String"), StringValue: aws.String(m.Key)},
			}
			if m.PartitionKey != "" {
				attrs["account"] = sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(m.PartitionKey)}
			}
			entries[i] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)),
				MessageBody: aws.String(string(m.Body)), MessageAttributes: attrs}
		}
		out, err := b.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(b.queueURL), Entries: entries})
		if err == nil && len(out.Failed) > 0 {
			err = fmt.Errorf("%d orders not sent: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
		if err != nil {
			return fmt.Errorf("checkout: sqs: publish: %w", err)
		}
		msgs = msgs[n:]
	}
	return nil
}

func (b *sqsBroker) Close() error { return nil }

type rabbitBroker struct{ cfg BrokerConfig }

func openRabbitMQ(cfg BrokerConfig) (*rabbitBroker, error) {
	if cfg.AMQPURL == "" {
		return nil, fmt.Errorf("checkout: rabbitmq: no URL")
	}
	return &rabbitBroker{cfg: cfg}, nil
}

func (b *rabbitBroker) Source(ctx context.Context, rc *consumer.Config) (consumer.Source, error) {
	src, err := amqpsource.New(ctx, amqpsource.Config{
		URL:                b.cfg.AMQPURL,
		Queue:              b.cfg.Topic,
		KeyHeader:          KeyHeader,
		Prefetch:           amqpsource.PrefetchFor(*rc),
		PartitionKeyHeader: "account",
		Declare:            &amqpsource.Topology{QueueType: amqpsource.QueueTypeQuorum},
		Logger:             b.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	rc.KeyFunc = src.Key
	return src, nil
}

// Publish declares nothing: the queue is declared by the first Source, so
// open one before publishing.
func (b *rabbitBroker) Publish(ctx context.Context, msgs ...Outgoing) error {
	conn, err := amqp.Dial(b.cfg.AMQPURL)
	if err != nil {
		return fmt.Errorf("checkout: rabbitmq: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("checkout: rabbitmq: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("checkout: rabbitmq: %w", err)
	}
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", b.cfg.Topic, true, false, amqp.Publishing{
			Headers:      amqp.Table{KeyHeader: m.Key, "account": m.PartitionKey},
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			Body:         m.Body,
		})
		if err != nil {
			return fmt.Errorf("checkout: rabbitmq: publish: %w", err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return errors.Join(errors.New("checkout: rabbitmq: publish not confirmed"), err)
		}
	}
	return nil
}

func (b *rabbitBroker) Close() error { return nil }
