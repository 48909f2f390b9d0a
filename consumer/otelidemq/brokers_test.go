package otelidemq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/internal/memstore"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sqssource"
)

// These tests publish through each broker's own client with an injected
// traceparent, consume with the real source and a runner, and check the
// process span's parent and attributes.

func suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func brokerCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// consumeOne runs a runner over src with the hook until the message with
// key was handled, and returns its process span.
func consumeOne(t *testing.T, tel *telemetry, src consumer.Source, name string) {
	t.Helper()
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan trace.SpanContext, 1)
	path := consumer.Transactional(store, func(ctx context.Context, _ *memstore.Tx, m *consumer.Message) error {
		select {
		case handled <- trace.SpanContextFromContext(ctx):
		default:
		}
		return nil
	})
	r, err := consumer.NewRunner(src, path, consumer.Config{Name: name, Concurrency: 1, Hooks: []consumer.Hook{tel.hook}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(brokerCtx(t))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-handled:
	case <-time.After(60 * time.Second):
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		t.Fatalf("message not handled in time; stats %+v", r.Stats())
	}
	// The process span ends once the message is acknowledged.
	if err := r.WaitIdle(brokerCtx(t), 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func checkOne(t *testing.T, tel *telemetry, parent trace.SpanContext, system, destination, id string) {
	t.Helper()
	spans := tel.processSpans()
	if len(spans) != 1 || len(spans[id]) != 1 {
		t.Fatalf("process spans by message ID %v, want one for %q", spans, id)
	}
	checkProcessSpan(t, spans[id][0], parent, system, destination)
	for _, name := range []string{"claim", "handler", "commit"} {
		if len(tel.covering(spans[id][0], name)) == 0 {
			t.Errorf("process span has no %s span, child or linked", name)
		}
	}
}

func TestKafkaTraceparent(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka; skipped with -short")
	}
	brokers := testenv.KafkaBrokers(t)
	ctx := brokerCtx(t)
	topic := "idemq-otel-" + suffix()
	if err := kafkasource.CreateTopics(ctx, nil, brokers,
		kafkasource.TopicSpec{Name: topic, Partitions: 1},
		kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(topic), Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, kafkasource.DeadLetterTopic(topic))

	parent, headers := producerSpan(t)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: &kafka.Transport{}}
	defer w.Close()
	km := kafka.Message{Value: []byte("body"), Headers: []kafka.Header{{Key: kafkasource.DefaultKeyHeader, Value: []byte("k1")}}}
	for k, v := range headers {
		km.Headers = append(km.Headers, kafka.Header{Key: k, Value: []byte(v)})
	}
	if err := w.WriteMessages(ctx, km); err != nil {
		t.Fatal(err)
	}

	group := "idemq-otel-" + suffix()
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: group})
	src, err := kafkasource.New(ctx, kafkasource.Config{
		Brokers: brokers, Topics: []string{topic}, GroupID: group,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 300 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
		JoinGroupBackoff: 200 * time.Millisecond, MaxWait: 250 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	consumeOne(t, tel, src, group)
	checkOne(t, tel, parent, otelidemq.SystemKafka, topic, topic+"/0/0")
}

func sqsTestClient(t *testing.T) *sqs.Client {
	t.Helper()
	c, err := sqssource.NewClient(context.Background(), testenv.SQSEndpoint(t),
		config.WithRegion(testenv.SQSRegion),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(testenv.SQSAccessKeyID, testenv.SQSSecretAccessKey, "")))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newSQSQueue(t *testing.T, c *sqs.Client) (name, url, dlq string) {
	t.Helper()
	ctx := brokerCtx(t)
	name = "idemq-otel-" + suffix()
	var urls []string
	for _, n := range []string{name, name + "-dlq"} {
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(n)})
		if err != nil {
			t.Fatal(err)
		}
		u := aws.ToString(out.QueueUrl)
		urls = append(urls, u)
		t.Cleanup(func() { _, _ = c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(u)}) })
	}
	return name, urls[0], urls[1]
}

func consumeSQS(t *testing.T, c *sqs.Client, tel *telemetry, url, dlq string) {
	t.Helper()
	src, err := sqssource.New(brokerCtx(t), c, sqssource.Config{QueueURL: url, DeadLetterQueueURL: dlq, VisibilityTimeout: 4 * time.Second, WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	consumeOne(t, tel, src, "sqs-consumer")
}

// A W3C traceparent in the SQS message attributes parents the span.
func TestSQSTraceparentAttribute(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ElasticMQ; skipped with -short")
	}
	c := sqsTestClient(t)
	name, url, dlq := newSQSQueue(t, c)
	parent, headers := producerSpan(t)
	attrs := map[string]types.MessageAttributeValue{}
	for k, v := range headers {
		attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	out, err := c.SendMessage(brokerCtx(t), &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("body"), MessageAttributes: attrs})
	if err != nil {
		t.Fatal(err)
	}
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: "sqs-consumer"})
	consumeSQS(t, c, tel, url, dlq)
	checkOne(t, tel, parent, otelidemq.SystemSQS, name, aws.ToString(out.MessageId))
}

// The AWSTraceHeader system attribute parents the span when there is no
// traceparent.
func TestSQSAWSTraceHeader(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ElasticMQ; skipped with -short")
	}
	c := sqsTestClient(t)
	name, url, dlq := newSQSQueue(t, c)
	parent, headers := producerSpan(t)
	// traceparent: 00-<trace id>-<span id>-01 → Root=1-<8>-<24>;Parent=<16>;Sampled=1
	f := strings.Split(headers["traceparent"], "-")
	xray := "Root=1-" + f[1][:8] + "-" + f[1][8:] + ";Parent=" + f[2] + ";Sampled=1"
	out, err := c.SendMessage(brokerCtx(t), &sqs.SendMessageInput{
		QueueUrl: aws.String(url), MessageBody: aws.String("body"),
		MessageSystemAttributes: map[string]types.MessageSystemAttributeValue{
			string(types.MessageSystemAttributeNameAWSTraceHeader): {DataType: aws.String("String"), StringValue: aws.String(xray)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: "sqs-consumer"})
	consumeSQS(t, c, tel, url, dlq)
	checkOne(t, tel, parent, otelidemq.SystemSQS, name, aws.ToString(out.MessageId))
}

// A traceparent in the AMQP headers parents the span.
func TestRabbitMQTraceparent(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ; skipped with -short")
	}
	url := testenv.AMQPURL(t)
	queue := "idemq.otel." + suffix()
	ctx := brokerCtx(t)
	src, err := amqpsource.New(ctx, amqpsource.Config{URL: url, Queue: queue, Declare: &amqpsource.Topology{QueueType: amqpsource.QueueTypeClassic}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	brokerenv.DeleteQueuesAtCleanup(t, url, amqpsource.QueueNames(amqpsource.Config{Queue: queue})...)

	parent, headers := producerSpan(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	h := amqp.Table{amqpsource.DefaultKeyHeader: "k1"}
	for k, v := range headers {
		h[k] = v
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
		amqp.Publishing{Headers: h, MessageId: "id-k1", DeliveryMode: amqp.Persistent, Body: []byte("body")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish not confirmed: %v %v", ok, err)
	}
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: "amqp-consumer"})
	consumeOne(t, tel, src, "amqp-consumer")
	checkOne(t, tel, parent, otelidemq.SystemRabbitMQ, queue, "id-k1")
}

// gauge returns the value of the int64 gauge name at the data point whose
// attributes include every one of want, and whether there is one.
func gauge(rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) (int64, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			g, ok := m.Data.(metricdata.Gauge[int64])
			if m.Name != name || !ok {
				continue
			}
		points:
			for _, p := range g.DataPoints {
				for _, kv := range want {
					if v, ok := p.Attributes.Value(kv.Key); !ok || v != kv.Value {
						continue points
					}
				}
				return p.Value, true
			}
		}
	}
	return 0, false
}

// The Kafka lag per partition is exported as a gauge read from the real
// broker: published, minus settled.
func TestKafkaLagGauge(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka; skipped with -short")
	}
	brokers := testenv.KafkaBrokers(t)
	ctx := brokerCtx(t)
	topic := "idemq-otel-lag-" + suffix()
	if err := kafkasource.CreateTopics(ctx, nil, brokers,
		kafkasource.TopicSpec{Name: topic, Partitions: 1},
		kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(topic), Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, kafkasource.DeadLetterTopic(topic))
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: &kafka.Transport{}}
	defer w.Close()
	const n, settled = 10, 4
	var kms []kafka.Message
	for i := range n {
		kms = append(kms, kafka.Message{Value: []byte("body"), Headers: []kafka.Header{{Key: kafkasource.DefaultKeyHeader, Value: []byte("k" + strconv.Itoa(i))}}})
	}
	if err := w.WriteMessages(ctx, kms...); err != nil {
		t.Fatal(err)
	}

	group := "idemq-otel-lag-" + suffix()
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: group})
	src, err := kafkasource.New(ctx, kafkasource.Config{
		Brokers: brokers, Topics: []string{topic}, GroupID: group,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 300 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
		JoinGroupBackoff: 200 * time.Millisecond, MaxWait: 250 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	reg, err := tel.hook.ObserveLag(src)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := reg.Unregister(); err != nil {
			t.Errorf("Unregister: %v", err)
		}
	}()

	var msgs []*consumer.Message
	for len(msgs) < n {
		got, err := src.Receive(ctx, n-len(msgs))
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, got...)
	}
	slices.SortFunc(msgs, func(a, b *consumer.Message) int { return strings.Compare(a.Key, b.Key) })
	var ack []*consumer.Message
	for _, m := range msgs {
		if k, _ := strconv.Atoi(strings.TrimPrefix(m.Key, "k")); k < settled {
			ack = append(ack, m)
		}
	}
	if err := src.Ack(ctx, ack); err != nil {
		t.Fatal(err)
	}
	lag, ok := gauge(tel.metrics(t), otelidemq.MetricKafkaLag,
		otelidemq.AttrDestination.String(topic), otelidemq.AttrPartition.String("0"), otelidemq.AttrConsumerGroup.String(group))
	if !ok || lag != n-settled {
		t.Fatalf("%s for %s/0 = %d (present %v), want %d", otelidemq.MetricKafkaLag, topic, lag, ok, n-settled)
	}
}
