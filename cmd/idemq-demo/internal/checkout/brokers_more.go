package checkout

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/sqssource"
)

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
	rc.KeyFunc = consumer.RequireKey
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
