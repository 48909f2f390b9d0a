package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/console"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/amqpsource/amqpdlq"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/kafkasource/kafkadlq"
	"github.com/idemq/idemq/sources/sqssource"
	"github.com/idemq/idemq/sources/sqssource/sqsdlq"
)

// rigWait bounds each wait of the console's fixtures.
const rigWait = 60 * time.Second

// The orders each broker's origin receives, and the poison among them:
// their handler fails them for good (consumer.Permanent) while the rig is
// broken, with these reasons, two of which the console groups as one
// ("bad SKU <n>").
const rigOrders = 6

var rigPoison = map[int]string{2: "bad SKU 17", 3: "bad SKU 4", 5: "card declined"}

// The reason groups' distinctive parts: the console names a group by the
// dead letter's reason with its numbers replaced by <n>.
const (
	groupSKU      = "bad SKU <n>"
	groupDeclined = "card declined"
)

func rigKey(broker string, i int) string { return fmt.Sprintf("%s-order-%d", broker, i) }

// rig is one broker's origin, dead-letter store, and a real runner
// consuming the origin into the effects table.
type rig struct {
	// broker is the broker's kind ("rabbitmq", "sqs", "kafka"); queue is
	// the dead-letter store's name in the console (its topic or queue
	// name).
	broker, queue string
	// flags are idemq console's flags for the dead-letter store.
	flags []string
	// open opens the dead-letter store.
	open func(ctx context.Context) (dlq.Broker, error)
	// runner consumes the origin into db.
	runner *consumer.Runner
	db     *effectsDB
	// healthURL serves the runner's console.WorkerReport.
	healthURL string
}

// rigScope is every rig's runner's Config.Name: the keys of the brokers
// differ, so the runners can share the scope, which idemq console's
// --scope names.
const rigScope = "orders"

// rigName returns a short unique name for a topic or queue: the
// screenshots show it.
func rigName() string { return "orders-" + strings.ToLower(rand.Text()[:6]) }

// effectsDB is the database the handlers write to, in a schema of the
// test's own: an effects table (one row per order handled), the
// runners' processed-message records and the outbox, where each handler
// publishes an event that no relay sends (the console's outbox backlog).
type effectsDB struct {
	url, schema string
	pool        *pgxpool.Pool
	store       *pgdedup.Store
	// broken makes the handlers fail the poison orders for good.
	broken atomic.Bool
}

func newEffectsDB(t *testing.T) *effectsDB {
	t.Helper()
	url := testenv.DatabaseURL(t)
	pool, schema := testenv.SchemaPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), rigWait)
	defer cancel()
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := idemq(t, "migrate", "--outbox", "--dsn", url, "--schema", schema); code != exitOK {
		t.Fatalf("idemq migrate --outbox = %d: %s", code, errOut)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "effects"}.Sanitize()+` (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	db := &effectsDB{url: url, schema: schema, pool: pool, store: store}
	db.broken.Store(true)
	return db
}

// effects returns how many rows each key has in the effects table.
func (d *effectsDB) effects(t *testing.T) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rigWait)
	defer cancel()
	rows, err := d.pool.Query(ctx, `SELECT key, count(*) FROM `+pgx.Identifier{d.schema, "effects"}.Sanitize()+` GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		k string
		n int
	}, error) {
		var v struct {
			k string
			n int
		}
		return v, r.Scan(&v.k, &v.n)
	})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, v := range out {
		m[v.k] = v.n
	}
	return m
}

// newRig returns the rig of a started runner on src whose handler writes
// one effects row and one outbox event per order, and fails the poison
// orders for good while d is broken; its report is served for the
// console's workers page. The runner stops at the test's end.
func (d *effectsDB) newRig(t *testing.T, broker, queue string, flags []string, src consumer.Source, open func(context.Context) (dlq.Broker, error)) *rig {
	t.Helper()
	rep := &console.WorkerReporter{}
	if lr, ok := src.(consumer.LagReporter); ok {
		rep.Lag = lr
	}
	effects := pgx.Identifier{d.schema, "effects"}.Sanitize()
	r, err := consumer.NewRunner(src, consumer.Transactional(d.store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		for i, reason := range rigPoison {
			if m.Key == rigKey(broker, i) && d.broken.Load() {
				return consumer.Permanent(errors.New(reason))
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` (key) VALUES ($1)`, m.Key); err != nil {
			return err
		}
		_, err := outbox.Schema(d.schema).Publish(ctx, tx, outbox.Message{Destination: "order-events", Key: m.Key, Body: m.Body})
		return err
	}), consumer.Config{Name: rigScope, Concurrency: 2, Logger: runtest.Logger(t), Hooks: []consumer.Hook{rep}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runtest.Start(t, r))
	health := httptest.NewServer(rep.Handler(r))
	t.Cleanup(health.Close)
	return &rig{broker: broker, queue: queue, flags: flags, open: open, runner: r, db: d, healthURL: health.URL + "/readyz"}
}

// waitDeadLetters waits until the runner handled the good orders and
// dead-lettered the poison ones.
func waitDeadLetters(t *testing.T, rg *rig) {
	t.Helper()
	runtest.WaitFor(t, rigWait, func() string {
		return fmt.Sprintf("%s: runner stats %+v, want %d handled and %d dead-lettered", rg.broker, rg.runner.Stats(), rigOrders-len(rigPoison), len(rigPoison))
	}, func() bool {
		st := rg.runner.Stats()
		return st.Handled >= uint64(rigOrders-len(rigPoison)) && st.DeadLettered >= uint64(len(rigPoison))
	})
}

// countDeadLetters lists the rig's dead-letter store.
func countDeadLetters(t *testing.T, rg *rig) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rigWait)
	defer cancel()
	b, err := rg.open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ls, err := dlq.List(ctx, b, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return len(ls)
}

func orderBody(i int) string { return fmt.Sprintf(`{"order":%d,"sku":"S-%d"}`, i, 100+i) }

// confirmChannel opens a RabbitMQ channel in confirm mode, closed with its
// connection when t ends.
func confirmChannel(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return ch
}

// rabbitRig: a RabbitMQ queue declared by amqpsource with its .dlq.
func rabbitRig(t *testing.T, db *effectsDB) *rig {
	t.Helper()
	url := testenv.AMQPURL(t)
	queue := rigName()
	cfg := amqpsource.Config{URL: url, Queue: queue, Declare: &amqpsource.Topology{}, Logger: runtest.Logger(t)}
	dead := amqpsource.DeadLetterQueue(cfg)
	brokerenv.DeleteQueuesAtCleanup(t, url, queue, dead)
	ctx, cancel := context.WithTimeout(context.Background(), rigWait)
	defer cancel()
	src, err := amqpsource.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	ch := confirmChannel(t, url)
	for i := 1; i <= rigOrders; i++ {
		key := rigKey("rabbitmq", i)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
			Headers: amqp.Table{amqpsource.DefaultKeyHeader: key}, DeliveryMode: amqp.Persistent,
			MessageId: "id-" + key, ContentType: "application/json", Body: []byte(orderBody(i)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish %s not confirmed (acked %v): %v", key, ok, err)
		}
	}
	return db.newRig(t, "rabbitmq", dead, []string{"--dlq", "rabbitmq:" + dead, "--amqp-url", url}, src, func(context.Context) (dlq.Broker, error) {
		return amqpdlq.New(amqpdlq.Config{URL: url, Queue: dead})
	})
}

// sqsRig: an ElasticMQ queue and its dead-letter queue.
func sqsRig(t *testing.T, db *effectsDB) *rig {
	t.Helper()
	endpoint := testenv.SQSEndpoint(t)
	c := sqs.New(sqs.Options{Region: testenv.SQSRegion, BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider(testenv.SQSAccessKeyID, testenv.SQSSecretAccessKey, "")})
	name := rigName()
	brokerenv.DeleteSQSQueuesAtCleanup(t, endpoint, name, name+"-dlq")
	ctx, cancel := context.WithTimeout(context.Background(), rigWait)
	defer cancel()
	var urls []string
	for _, n := range []string{name, name + "-dlq"} {
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(n)})
		if err != nil {
			t.Fatal(err)
		}
		urls = append(urls, aws.ToString(out.QueueUrl))
	}
	queue, dead := urls[0], urls[1]
	for i := 1; i <= rigOrders; i++ {
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(orderBody(i)),
			MessageAttributes: map[string]types.MessageAttributeValue{
				"idempotency-key": {DataType: aws.String("String"), StringValue: aws.String(rigKey("sqs", i))},
			}}); err != nil {
			t.Fatal(err)
		}
	}
	src, err := sqssource.New(ctx, c, sqssource.Config{QueueURL: queue, DeadLetterQueueURL: dead,
		KeyAttribute: "idempotency-key", WaitTime: time.Second, Logger: runtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	flags := []string{"--dlq", "sqs:" + dead, "--sqs-endpoint", endpoint, "--key-attribute", "idempotency-key"}
	return db.newRig(t, "sqs", name+"-dlq", flags, src, func(context.Context) (dlq.Broker, error) {
		return sqsdlq.New(sqsdlq.Config{Client: c, QueueURL: dead, KeyAttribute: "idempotency-key"})
	})
}

// kafkaRig: a one-partition topic and its dead-letter topic.
func kafkaRig(t *testing.T, db *effectsDB) *rig {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	topic := rigName()
	dead := kafkasource.DeadLetterTopic(topic)
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, dead, kafkadlq.ProgressTopic(dead))
	ctx, cancel := context.WithTimeout(context.Background(), rigWait)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic}, kafkasource.TopicSpec{Name: dead}); err != nil {
		t.Fatal(err)
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Transport: tr, Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	var msgs []kafka.Message
	for i := 1; i <= rigOrders; i++ {
		key := rigKey("kafka", i)
		msgs = append(msgs, kafka.Message{Key: []byte(key), Value: []byte(orderBody(i)),
			Headers: []kafka.Header{{Key: kafkasource.DefaultKeyHeader, Value: []byte(key)}}})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	src, err := kafkasource.New(context.Background(), kafkasource.Config{
		Brokers: brokers, Topics: []string{topic}, GroupID: runtest.UniqueName(t, "g"),
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 300 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
		JoinGroupBackoff: 200 * time.Millisecond, MaxWait: 250 * time.Millisecond, CommitInterval: 100 * time.Millisecond,
		Logger: runtest.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return db.newRig(t, "kafka", dead, []string{"--dlq", "kafka:" + dead, "--brokers", strings.Join(brokers, ",")}, src, func(context.Context) (dlq.Broker, error) {
		return kafkadlq.New(kafkadlq.Config{Brokers: brokers, Topic: dead})
	})
}

// brokerKeys returns the keys of broker's orders i.
func brokerKeys(broker string, is ...int) []string {
	var out []string
	for _, i := range is {
		out = append(out, rigKey(broker, i))
	}
	return out
}
