package testenv_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
)

// These smoke tests talk to the real services through the client libraries
// that idemq's adapters use.

func unique(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestPostgresSmoke(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 30*time.Second)
	url := testenv.SchemaURL(t, testenv.DatabaseURL(t))
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY)"); err != nil {
		t.Fatalf("create table: %v", err)
	}
	var schema string
	var n int
	if err := conn.QueryRow(ctx,
		"INSERT INTO items VALUES (1) RETURNING current_schema(), (SELECT count(*) FROM items) + 1",
	).Scan(&schema, &n); err != nil {
		t.Fatalf("query: %v", err)
	}
	if n != 1 || schema == "public" {
		t.Fatalf("got schema %q, count %d; want the test schema and 1", schema, n)
	}
}

func TestRedisSmoke(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Second)
	rdb := newRedis(t)
	key := unique("testenv-smoke")
	if err := rdb.Set(ctx, key, "v1", time.Minute).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	got, err := rdb.Get(ctx, key).Result()
	if err != nil || got != "v1" {
		t.Fatalf("GET = %q, %v; want v1", got, err)
	}
}

func newRedis(t *testing.T) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatalf("parse redis URL: %v", err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func TestRabbitMQSmoke(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 30*time.Second)
	ch := amqpChannel(t)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("declare: %v", err)
	}
	if err := ch.PublishWithContext(ctx, "", q.Name, false, false, amqp.Publishing{
		MessageId: "m1", Body: []byte("hello"),
	}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	deliveries, err := ch.Consume(q.Name, "", false, true, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	select {
	case d := <-deliveries:
		if d.MessageId != "m1" || string(d.Body) != "hello" {
			t.Fatalf("got %q/%q; want m1/hello", d.MessageId, d.Body)
		}
		if err := d.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
}

// TestRabbitMQQuorumDeadLetter checks that quorum queues and dead-letter
// exchanges work: a message rejected without requeue on a quorum queue
// arrives in the dead-letter queue.
func TestRabbitMQQuorumDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 30*time.Second)
	ch := amqpChannel(t)
	dlx, dlq, work := unique("testenv-dlx"), unique("testenv-dlq"), unique("testenv-work")
	// Auto-delete does not cover these: the queues never get a consumer.
	brokerenv.DeleteExchangesAtCleanup(t, testenv.AMQPURL(t), dlx)
	brokerenv.DeleteQueuesAtCleanup(t, testenv.AMQPURL(t), work, dlq)
	if err := ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		t.Fatalf("declare exchange: %v", err)
	}
	if _, err := ch.QueueDeclare(dlq, false, true, false, false, nil); err != nil {
		t.Fatalf("declare dead-letter queue: %v", err)
	}
	if err := ch.QueueBind(dlq, "", dlx, false, nil); err != nil {
		t.Fatalf("bind: %v", err)
	}
	if _, err := ch.QueueDeclare(work, true, false, false, false, amqp.Table{
		"x-queue-type":           "quorum",
		"x-dead-letter-exchange": dlx,
	}); err != nil {
		t.Fatalf("declare quorum queue: %v", err)
	}
	if err := ch.PublishWithContext(ctx, "", work, false, false, amqp.Publishing{Body: []byte("poison")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	d := getOne(ctx, t, ch, work)
	if err := d.Nack(false, false); err != nil {
		t.Fatalf("nack: %v", err)
	}
	if d := getOne(ctx, t, ch, dlq); string(d.Body) != "poison" {
		t.Fatalf("dead-lettered body %q; want poison", d.Body)
	}
}

func getOne(ctx context.Context, t *testing.T, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if ok {
			return d
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no message in %s", queue)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func amqpChannel(t *testing.T) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	return ch
}

func TestKafkaSmoke(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 90*time.Second)
	brokers := testenv.KafkaBrokers(t)
	topic, group := unique("testenv-smoke"), unique("testenv-group")
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic)
	client := &kafka.Client{Addr: kafka.TCP(brokers...)}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
	}}})
	if err != nil {
		t.Fatalf("create topic: %v", err)
	}
	if err := res.Errors[topic]; err != nil {
		t.Fatalf("create topic: %v", err)
	}

	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("k1"), Value: []byte("hello")}); err != nil {
		t.Fatalf("write: %v", err)
	}

	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:     brokers,
		GroupID:     group,
		Topic:       topic,
		StartOffset: kafka.FirstOffset,
		MaxWait:     500 * time.Millisecond,
	})
	defer r.Close()
	m, err := r.FetchMessage(ctx)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if string(m.Key) != "k1" || string(m.Value) != "hello" {
		t.Fatalf("got %q=%q; want k1=hello", m.Key, m.Value)
	}
	if err := r.CommitMessages(ctx, m); err != nil {
		t.Fatalf("commit: %v", err)
	}
	off, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {0}}})
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	if p := off.Topics[topic]; len(p) != 1 || p[0].CommittedOffset != m.Offset+1 {
		t.Fatalf("committed offsets %+v; want %d", p, m.Offset+1)
	}
}

func TestSQSSmoke(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 30*time.Second)
	cfg, err := config.LoadDefaultConfig(ctx,
		config.WithRegion(testenv.SQSRegion),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(
			testenv.SQSAccessKeyID, testenv.SQSSecretAccessKey, "")),
	)
	if err != nil {
		t.Fatalf("load config: %v", err)
	}
	endpoint := testenv.SQSEndpoint(t)
	client := sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(endpoint) })

	created, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(unique("testenv-smoke"))})
	if err != nil {
		t.Fatalf("create queue: %v", err)
	}
	queueURL := created.QueueUrl
	t.Cleanup(func() {
		if _, err := client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: queueURL}); err != nil {
			t.Logf("delete queue: %v", err)
		}
	})
	sent, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: queueURL, MessageBody: aws.String("hello")})
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	got, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl: queueURL, MaxNumberOfMessages: 1, WaitTimeSeconds: 5,
	})
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	if len(got.Messages) != 1 || aws.ToString(got.Messages[0].MessageId) != aws.ToString(sent.MessageId) ||
		aws.ToString(got.Messages[0].Body) != "hello" {
		t.Fatalf("received %+v; want message %s", got.Messages, aws.ToString(sent.MessageId))
	}
	if _, err := client.DeleteMessage(ctx, &sqs.DeleteMessageInput{
		QueueUrl: queueURL, ReceiptHandle: got.Messages[0].ReceiptHandle,
	}); err != nil {
		t.Fatalf("delete message: %v", err)
	}
}

// TestRestartRedisSmoke restarts Redis through services.sh and checks that a
// client keeps working. Other packages' tests see a short Redis outage.
func TestRestartRedisSmoke(t *testing.T) {
	ctx := testContext(t, 60*time.Second)
	rdb := newRedis(t)
	key := unique("testenv-restart")
	if err := rdb.Set(ctx, key, "before", time.Minute).Err(); err != nil {
		t.Fatalf("SET before restart: %v", err)
	}
	testenv.Restart(t, testenv.Redis)
	var err error
	for range 20 {
		if err = rdb.Set(ctx, key, "after", time.Minute).Err(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("SET after restart: %v", err)
	}
	if got, err := rdb.Get(ctx, key).Result(); err != nil || got != "after" {
		t.Fatalf("GET after restart = %q, %v; want after", got, err)
	}
}
