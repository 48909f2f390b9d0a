package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sqssource"
)

// sqsKeyAttribute is the SQS message attribute that carries the key.
const sqsKeyAttribute = "chaos-key"

// outMsg is one message the producer sends.
type outMsg struct {
	Key  string
	Body []byte
}

// broker is one scenario's broker: its destinations, its producer and its
// dead-letter destination.
type broker interface {
	// setup creates the destinations the workers read.
	setup(ctx context.Context) error
	// workerArgs are the worker's flags that name the broker and the
	// destination.
	workerArgs() []string
	// ready reports whether the producer may send (the workers declared
	// what they declare).
	ready(ctx context.Context) bool
	// send sends msgs, each once.
	send(ctx context.Context, msgs []outMsg) error
	// deadLetters adds to seen the keys of the messages in the dead-letter
	// destination it has not returned before.
	deadLetters(ctx context.Context, seen map[string]int) error
	// cleanup deletes the destinations.
	cleanup(ctx context.Context)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// newBroker returns the broker of kind for the run's names. The lease
// scenario's broker is SQS. With cluster, the Kafka scenario runs on the
// three brokers of the kafka-cluster profile, its topics replicated three
// times.
func newBroker(kind, name string, cluster bool) (broker, error) {
	switch kind {
	case "kafka":
		if cluster {
			return &kafkaBroker{brokers: strings.Split(envOr("TEST_KAFKA_CLUSTER_BROKERS", "127.0.0.1:9191,127.0.0.1:9192,127.0.0.1:9193"), ","),
				topic: name, replicas: 3}, nil
		}
		return &kafkaBroker{brokers: strings.Split(envOr("TEST_KAFKA_BROKERS", "127.0.0.1:9092"), ","), topic: name, replicas: 1}, nil
	case "sqs", "lease":
		return &sqsBroker{endpoint: envOr("TEST_SQS_ENDPOINT", "http://127.0.0.1:9324"), name: name}, nil
	case "amqp":
		return &amqpBroker{url: envOr("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), queue: name}, nil
	}
	return nil, fmt.Errorf("unknown scenario %q (want kafka, sqs, amqp or lease)", kind)
}

// kafkaBroker is a topic of 6 partitions and its dead-letter topic.
type kafkaBroker struct {
	brokers  []string
	topic    string
	replicas int // replication factor of the topics
	w        *kafka.Writer
	dlqNext  int64 // the next dead-letter offset to read
}

// dial connects to the first broker that answers: one may be down.
func (k *kafkaBroker) dial(ctx context.Context, dial func(ctx context.Context, addr string) (*kafka.Conn, error)) (*kafka.Conn, error) {
	var errs []error
	for _, b := range k.brokers {
		c, err := dial(ctx, b)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (k *kafkaBroker) setup(ctx context.Context) error {
	if err := kafkasource.CreateTopics(ctx, nil, k.brokers,
		kafkasource.TopicSpec{Name: k.topic, Partitions: 6, ReplicationFactor: k.replicas},
		kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(k.topic), Partitions: 1, ReplicationFactor: k.replicas},
	); err != nil {
		return err
	}
	k.w = &kafka.Writer{
		Addr: kafka.TCP(k.brokers...), Topic: k.topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, Transport: &kafka.Transport{},
	}
	return nil
}

func (k *kafkaBroker) workerArgs() []string {
	return []string{"-broker", "kafka", "-kafka-brokers", strings.Join(k.brokers, ","), "-dest", k.topic, "-group", k.topic}
}

func (k *kafkaBroker) ready(context.Context) bool { return true }

func (k *kafkaBroker) send(ctx context.Context, msgs []outMsg) error {
	km := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		km[i] = kafka.Message{Key: []byte(m.Key), Value: m.Body,
			Headers: []kafka.Header{{Key: kafkasource.DefaultKeyHeader, Value: []byte(m.Key)}}}
	}
	return k.w.WriteMessages(ctx, km...)
}

func (k *kafkaBroker) deadLetters(ctx context.Context, seen map[string]int) error {
	dlq := kafkasource.DeadLetterTopic(k.topic)
	conn, err := k.dial(ctx, func(ctx context.Context, addr string) (*kafka.Conn, error) {
		return kafka.DialLeader(ctx, "tcp", addr, dlq, 0)
	})
	if err != nil {
		return err
	}
	last, err := conn.ReadLastOffset()
	_ = conn.Close() // a read-only connection: nothing to flush
	if err != nil || last <= k.dlqNext {
		return err
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.brokers, Topic: dlq, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(k.dlqNext); err != nil {
		return err
	}
	for k.dlqNext < last {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			return err
		}
		k.dlqNext = m.Offset + 1
		key := ""
		for _, h := range m.Headers {
			if h.Key == consumer.MetaKey || (key == "" && h.Key == kafkasource.DefaultKeyHeader) {
				key = string(h.Value)
			}
		}
		seen[key]++
	}
	return nil
}

func (k *kafkaBroker) cleanup(ctx context.Context) {
	if k.w != nil {
		_ = k.w.Close()
	}
	// The workers' group has the topic's name; it has no member left.
	client := &kafka.Client{Addr: kafka.TCP(k.brokers...)}
	if _, err := client.DeleteGroups(ctx, &kafka.DeleteGroupsRequest{GroupIDs: []string{k.topic}}); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: delete group:", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := kafkasource.DeleteTopics(ctx, nil, k.brokers, k.topic, kafkasource.DeadLetterTopic(k.topic)); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
	}
}

// sqsBroker is a queue and its dead-letter queue on the SQS emulator.
type sqsBroker struct {
	endpoint, name  string
	client          *sqs.Client
	queueURL, dlURL string
}

func (s *sqsBroker) setup(ctx context.Context) error {
	client, err := sqssource.NewClient(ctx, s.endpoint, config.WithRegion("us-east-1"),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("local", "local", "")))
	if err != nil {
		return err
	}
	s.client = client
	create := func(name string) (string, error) {
		out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
		if err != nil {
			return "", fmt.Errorf("create queue %s: %w", name, err)
		}
		return aws.ToString(out.QueueUrl), nil
	}
	if s.dlURL, err = create(s.name + "-dlq"); err != nil {
		return err
	}
	s.queueURL, err = create(s.name)
	return err
}

func (s *sqsBroker) workerArgs() []string {
	return []string{"-broker", "sqs", "-dest", s.queueURL, "-dlq", s.dlURL, "-key-attribute", sqsKeyAttribute,
		"-group", s.name, "-batch", strconv.Itoa(sqssource.MaxBatch)}
}

func (s *sqsBroker) ready(context.Context) bool { return true }

func (s *sqsBroker) send(ctx context.Context, msgs []outMsg) error {
	for len(msgs) > 0 {
		n := min(len(msgs), sqssource.MaxBatch)
		entries := make([]types.SendMessageBatchRequestEntry, n)
		for i, m := range msgs[:n] {
			entries[i] = types.SendMessageBatchRequestEntry{
				Id:          aws.String(strconv.Itoa(i)),
				MessageBody: aws.String(string(m.Body)),
				MessageAttributes: map[string]types.MessageAttributeValue{
					sqsKeyAttribute: {DataType: aws.String("String"), StringValue: aws.String(m.Key)},
				},
			}
		}
		out, err := s.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(s.queueURL), Entries: entries})
		if err == nil && len(out.Failed) > 0 {
			err = fmt.Errorf("%d messages not sent: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
		if err != nil {
			return err
		}
		msgs = msgs[n:]
	}
	return nil
}

// deadLetters receives the dead-letter queue's messages and deletes them,
// so each is counted once.
func (s *sqsBroker) deadLetters(ctx context.Context, seen map[string]int) error {
	for {
		out, err := s.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(s.dlURL), MaxNumberOfMessages: sqssource.MaxBatch,
			MessageAttributeNames: []string{"All"}, VisibilityTimeout: 60,
		})
		if err != nil {
			return err
		}
		if len(out.Messages) == 0 {
			return nil
		}
		for _, m := range out.Messages {
			if a, ok := m.MessageAttributes[sqsKeyAttribute]; ok {
				seen[aws.ToString(a.StringValue)]++
			}
			if _, err := s.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(s.dlURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				return err
			}
		}
	}
}

func (s *sqsBroker) cleanup(ctx context.Context) {
	for _, u := range []string{s.queueURL, s.dlURL} {
		if u != "" {
			_, _ = s.client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(u)})
		}
	}
}

// amqpBroker is a quorum queue the workers declare, with its dead-letter
// queue.
type amqpBroker struct {
	url, queue string
	conn       *amqp.Connection
	ch         *amqp.Channel
	// returns receives the messages the broker returned as unroutable:
	// a mandatory publish that reaches no queue is returned, then
	// confirmed, so a confirm alone does not prove it was enqueued.
	returns chan amqp.Return
}

func (a *amqpBroker) dlq() string {
	return amqpsource.DeadLetterQueue(amqpsource.Config{Queue: a.queue})
}

// connection returns the connection, dialling again when RabbitMQ closed
// it (a restart).
func (a *amqpBroker) connection() (*amqp.Connection, error) {
	if a.conn != nil && !a.conn.IsClosed() {
		return a.conn, nil
	}
	conn, err := amqp.Dial(a.url)
	if err != nil {
		return nil, err
	}
	a.conn, a.ch = conn, nil
	return conn, nil
}

func (a *amqpBroker) setup(context.Context) error {
	_, err := a.connection()
	return err
}

func (a *amqpBroker) workerArgs() []string {
	return []string{"-broker", "amqp", "-dest", a.queue, "-group", a.queue}
}

// ready reports whether a worker has declared the queue: messages
// published before would be unroutable.
func (a *amqpBroker) ready(context.Context) bool {
	conn, err := a.connection()
	if err != nil {
		return false
	}
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(a.queue, true, false, false, false, nil)
	return err == nil
}

func (a *amqpBroker) send(ctx context.Context, msgs []outMsg) error {
	conn, err := a.connection()
	if err != nil {
		return err
	}
	if a.ch == nil || a.ch.IsClosed() {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		if err := ch.Confirm(false); err != nil {
			return err
		}
		a.ch, a.returns = ch, ch.NotifyReturn(make(chan amqp.Return, 4096))
	}
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		dc, err := a.ch.PublishWithDeferredConfirmWithContext(ctx, "", a.queue, true, false, amqp.Publishing{
			Headers:      amqp.Table{amqpsource.DefaultKeyHeader: m.Key},
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			Body:         m.Body,
		})
		if err != nil {
			return err
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return errors.Join(errors.New("publish not confirmed"), err)
		}
	}
	// A return precedes its message's confirm on the wire, and the client
	// hands it over before it reads the confirm: every return of this chunk
	// is in the channel now.
	if n := len(a.returns); n > 0 {
		for range n {
			<-a.returns
		}
		fmt.Printf("chaos: amqp: %d of %d messages returned unroutable (the queue was not there yet); the chunk is sent again\n", n, len(msgs))
		return fmt.Errorf("%d messages returned unroutable", n)
	}
	return nil
}

// deadLetters takes the dead-letter queue's messages, so each is counted
// once.
func (a *amqpBroker) deadLetters(_ context.Context, seen map[string]int) error {
	conn, err := a.connection()
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	for {
		d, ok, err := ch.Get(a.dlq(), true)
		if err != nil || !ok {
			return err
		}
		if k, ok := d.Headers[consumer.MetaKey].(string); ok {
			seen[k]++
		} else if k, ok := d.Headers[amqpsource.DefaultKeyHeader].(string); ok {
			seen[k]++
		}
	}
}

// depther is a broker that can tell how many messages wait in its queue.
type depther interface {
	depth(ctx context.Context) (int, error)
}

// depth is the number of messages ready in the queue.
func (a *amqpBroker) depth(context.Context) (int, error) {
	conn, err := a.connection()
	if err != nil {
		return 0, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(a.queue, true, false, false, false, nil)
	return q.Messages, err
}

func (a *amqpBroker) cleanup(context.Context) {
	conn, err := a.connection()
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: delete queues: %v\n", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	// The retry queues do not expire (amqpsource refuses x-expires on
	// at-least-once retry queues): delete them too.
	for _, q := range amqpsource.QueueNames(amqpsource.Config{Queue: a.queue}) {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: delete queue %s: %v\n", q, err)
			if ch, err = conn.Channel(); err != nil {
				return
			}
		}
	}
}
