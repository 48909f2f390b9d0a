package otelidemq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	neturl "net/url"
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
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/dedup/memdedup"
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
	store := memStore(t)
	handled := make(chan trace.SpanContext, 1)
	path := consumer.Transactional(store, func(ctx context.Context, _ *memdedup.Tx, m *consumer.Message) error {
		select {
		case handled <- trace.SpanContextFromContext(ctx):
		default:
		}
		return nil
	})
	r := tel.runner(t, src, path, consumer.Config{Name: name, Concurrency: 1})
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

func checkOne(t *testing.T, tel *telemetry, producer trace.SpanContext, id string, want []attribute.KeyValue, absent ...attribute.Key) {
	t.Helper()
	spans := tel.processSpans()
	if len(spans) != 1 || len(spans[id]) != 1 {
		t.Fatalf("process spans by message ID %v, want one for %q", spans, id)
	}
	checkConventions(t, spans[id][0], producer, want, absent)
	for _, name := range []string{"claim", "handler", "commit"} {
		if len(tel.covering(spans[id][0], name)) == 0 {
			t.Errorf("process span has no %s span, child or linked", name)
		}
	}
}

// checkConventions asserts that s is a process span as the messaging
// semantic conventions (semconv v1.41.0) make one by default: kind consumer,
// named "process <messaging.destination.name>", a root span with one link,
// to the producer's (creation) context, every attribute of want with its
// value, and none of absent nor of the attributes the conventions rule out
// on a single-message process span.
func checkConventions(t *testing.T, s sdktrace.ReadOnlySpan, producer trace.SpanContext, want []attribute.KeyValue, absent []attribute.Key) {
	t.Helper()
	if s.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("span %q kind %v, want consumer", s.Name(), s.SpanKind())
	}
	if s.Parent().IsValid() {
		t.Errorf("process span has parent %s/%s, want a root span linked to the producer", s.Parent().TraceID(), s.Parent().SpanID())
	}
	if l := s.Links(); len(l) != 1 || l[0].SpanContext.TraceID() != producer.TraceID() || l[0].SpanContext.SpanID() != producer.SpanID() {
		t.Errorf("process span links %v, want one to the producer's %s/%s", l, producer.TraceID(), producer.SpanID())
	}
	for _, kv := range want {
		if kv.Key == semconv.MessagingDestinationNameKey && s.Name() != "process "+kv.Value.AsString() {
			t.Errorf("span name %q, want %q", s.Name(), "process "+kv.Value.AsString())
		}
		if got, ok := attr(s, kv.Key); !ok || got != kv.Value {
			t.Errorf("attribute %s = %q (present %v), want %q", kv.Key, got.String(), ok, kv.Value.String())
		}
	}
	absent = append(absent, semconv.MessagingBatchMessageCountKey, "messaging.message.delivery_count")
	for _, k := range absent {
		if v, ok := attr(s, k); ok {
			t.Errorf("attribute %s = %q present, want absent", k, v.String())
		}
	}
}

// processAttrs are the attributes every process span has, for message id
// (none when empty) of system from destination, received from server
// (host:port).
func processAttrs(t *testing.T, system attribute.KeyValue, destination, id, server string) []attribute.KeyValue {
	t.Helper()
	host, port, err := net.SplitHostPort(server)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	kvs := []attribute.KeyValue{system, semconv.MessagingDestinationName(destination),
		semconv.MessagingOperationName("process"), semconv.MessagingOperationTypeProcess,
		semconv.ServerAddress(host), semconv.ServerPort(p)}
	if id != "" {
		kvs = append(kvs, semconv.MessagingMessageID(id))
	}
	return kvs
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
	km := kafka.Message{Key: []byte("order-7"), Value: []byte("body"), Headers: []kafka.Header{{Key: kafkasource.DefaultKeyHeader, Value: []byte("k1")}}}
	for k, v := range headers {
		km.Headers = append(km.Headers, kafka.Header{Key: k, Value: []byte(v)})
	}
	if err := w.WriteMessages(ctx, km); err != nil {
		t.Fatal(err)
	}

	group := "idemq-otel-" + suffix()
	// No Config.ConsumerGroup: the group comes from the source.
	tel := newTelemetry(t, otelidemq.Config{})
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
	// No messaging.message.id: a Kafka message has none (the source's ID is
	// the topic, partition and offset, which have attributes of their own).
	want := append(processAttrs(t, semconv.MessagingSystemKafka, topic, "", brokers[0]),
		semconv.MessagingConsumerGroupName(group), semconv.MessagingDestinationPartitionID("0"),
		semconv.MessagingKafkaOffset(0), semconv.MessagingKafkaMessageKey("order-7"))
	checkOne(t, tel, parent, "", want, semconv.AWSSQSQueueURLKey, semconv.MessagingMessageIDKey)
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

// checkSQS checks the process span of message id received from the queue
// name at url: aws.sqs.queue.url, and no consumer group (the conventions
// define none for SQS, whatever Config.ConsumerGroup says).
func checkSQS(t *testing.T, tel *telemetry, producer trace.SpanContext, name, url, id string) {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	want := append(processAttrs(t, semconv.MessagingSystemAWSSQS, name, id, u.Host), semconv.AWSSQSQueueURL(url))
	checkOne(t, tel, producer, id, want, semconv.MessagingConsumerGroupNameKey, semconv.MessagingDestinationPartitionIDKey)
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
	checkSQS(t, tel, parent, name, url, aws.ToString(out.MessageId))
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
	checkSQS(t, tel, parent, name, url, aws.ToString(out.MessageId))
}

// A traceparent in the AMQP headers parents the span; a message without a
// message-id property gets no messaging.message.id.
func TestRabbitMQTraceparent(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ; skipped with -short")
	}
	for _, id := range []string{"id-k1", ""} {
		t.Run("message-id "+strconv.Quote(id), func(t *testing.T) { rabbitMQTraceparent(t, id) })
	}
}

func rabbitMQTraceparent(t *testing.T, id string) {
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
	// Through a named exchange with a routing key other than the queue's
	// name, so that the destination name has all three parts.
	const exchange = "amq.direct"
	routingKey := "rk." + suffix()
	if err := ch.QueueBind(queue, routingKey, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, true, false,
		amqp.Publishing{Headers: h, MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte("body")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish not confirmed: %v %v", ok, err)
	}
	tel := newTelemetry(t, otelidemq.Config{ConsumerGroup: "amqp-consumer"})
	consumeOne(t, tel, src, "amqp-consumer")
	u, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	want := append(processAttrs(t, semconv.MessagingSystemRabbitMQ, exchange+":"+routingKey+":"+queue, id, net.JoinHostPort(u.Host, strconv.Itoa(u.Port))),
		semconv.MessagingRabbitMQDestinationRoutingKey(routingKey), semconv.MessagingRabbitMQMessageDeliveryTag(1))
	absent := []attribute.Key{semconv.MessagingConsumerGroupNameKey, semconv.MessagingDestinationPartitionIDKey}
	if id == "" {
		absent = append(absent, semconv.MessagingMessageIDKey)
	}
	checkOne(t, tel, parent, id, want, absent...)
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
