// Command outbox measures, in one run against real brokers and a real
// PostgreSQL, how fast the outbox relay publishes compared with the raw
// producer of each broker:
//
//   - raw: the broker's client publishing the same messages in batches of
//     the relay's size and waiting for each batch's confirmation (kafka-go
//     Writer with RequireAll; SQS SendMessageBatch of 10, one call after
//     another; RabbitMQ publisher confirms, mandatory), each message with
//     the idempotency-key header or attribute the relay sends;
//   - relay: one outbox.Relay (batch 100) draining the same number of rows
//     committed beforehand to the outbox table, claiming, publishing
//     through the broker's Publisher and marking each batch sent, with
//     Concurrency 1 and 2 (one claim loop or two; each loop records one
//     batch while it claims and publishes the next), on a pool of
//     2 × Concurrency + 2 connections.
//
// It prints messages/s and the ratio relay/raw. The "none" row is the
// database's ceiling: the relay over a publisher that confirms at once
// (claim, update and commit of each batch only).
//
// Each relay column is followed by the relay's PostgreSQL round trips per
// batch (a pgx tracer on the relay's own pool). -cpuprofile writes a CPU
// profile of the run whose samples carry the label phase=raw or phase=relay
// (go tool pprof -tagfocus phase=relay).
//
//	go -C cmd/internal run ./bench/outbox [-broker kafka|sqs|rabbitmq|none|all] [-n 20000] [-rounds 1] [-cpuprofile f]
//
// TEST_KAFKA_BROKERS, TEST_SQS_ENDPOINT, TEST_AMQP_URL and TEST_DATABASE_URL
// select other servers.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/cmd/internal/bench/handwritten"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/internal/pgtrace"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/kafkaoutbox"
	"github.com/idemq/idemq/sinks/outbox/sqsoutbox"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sqssource"
)

const (
	schema = "idemq_bench_outbox"
	batch  = 100
	keys   = 1000
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	var (
		broker  = flag.String("broker", "all", "kafka, sqs, rabbitmq, none (the relay's database ceiling) or all")
		n       = flag.Int("n", 20000, "messages per run (SQS runs use n/4)")
		brokers = flag.String("brokers", envOr("TEST_KAFKA_BROKERS", "127.0.0.1:9092"), "Kafka bootstrap brokers")
		sqsURL  = flag.String("sqs", envOr("TEST_SQS_ENDPOINT", "http://127.0.0.1:9324"), "SQS endpoint")
		amqpURL = flag.String("amqp", "", "RabbitMQ URL (default: $TEST_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/)")
		dsn     = flag.String("dsn", "", "PostgreSQL URL (default: $TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable)")
		rounds  = flag.Int("rounds", 1, "rounds per broker; even rounds measure in the reverse order (relay c=2, c=1, then raw)")
		cpuprof = flag.String("cpuprofile", "", "write a CPU profile of the run to this file (samples labelled phase=raw or phase=relay)")
	)
	flag.Parse()
	stopProfile, err := handwritten.StartCPUProfile(*cpuprof)
	if err != nil {
		fail(err)
	}
	defer stopProfile()
	if *amqpURL == "" {
		*amqpURL = envOr("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	}
	if *dsn == "" {
		*dsn = envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable")
	}
	ctx := context.Background()
	pool, err := openPool(ctx, *dsn)
	if err != nil {
		fail(err)
	}
	defer pool.Close()
	suffix := randomSuffix()
	fmt.Printf("%-11s %8s %12s %12s %7s %8s %12s %7s %8s\n", "broker", "messages", "raw msg/s", "relay c=1", "ratio", "rt/batch", "relay c=2", "ratio", "rt/batch")
	run := func(name string, count int, dest string, raw func([]outbox.Message) error, pub outbox.Publisher) {
		for round := 1; round <= *rounds; round++ {
			var rawRate float64
			measureRaw := func() {
				msgs := messages(dest, count)
				start := time.Now()
				pprof.Do(ctx, pprof.Labels("phase", "raw"), func(context.Context) {
					for i := 0; i < len(msgs); i += batch {
						if err := raw(msgs[i:min(i+batch, len(msgs))]); err != nil {
							fail(fmt.Errorf("%s raw: %w", name, err))
						}
					}
				})
				rawRate = float64(count) / time.Since(start).Seconds()
			}
			var relays [2]relayResult
			measureRelay := func(concurrency int) {
				var err error
				if relays[concurrency-1], err = relay(ctx, pool, *dsn, pub, messages(dest, count), concurrency); err != nil {
					fail(fmt.Errorf("%s relay: %w", name, err))
				}
			}
			// Even rounds run in the reverse order: raw, relay c=1, relay c=2,
			// then relay c=2, relay c=1, raw.
			if round%2 == 1 {
				measureRaw()
				measureRelay(1)
				measureRelay(2)
			} else {
				measureRelay(2)
				measureRelay(1)
				measureRaw()
			}
			label := name
			if *rounds > 1 {
				label = fmt.Sprintf("%s r%d", name, round)
			}
			fmt.Printf("%-11s %8d %12.0f %12.0f %6.2fx %8.2f %12.0f %6.2fx %8.2f\n", label, count, rawRate,
				relays[0].rate, relays[0].rate/rawRate, relays[0].tripsPerBatch, relays[1].rate, relays[1].rate/rawRate, relays[1].tripsPerBatch)
		}
	}
	if *broker == "all" || *broker == "none" {
		relay1, err := relay(ctx, pool, *dsn, confirmAtOnce{}, messages("none", *n), 1)
		if err != nil {
			fail(fmt.Errorf("none relay: %w", err))
		}
		relay2, err := relay(ctx, pool, *dsn, confirmAtOnce{}, messages("none", *n), 2)
		if err != nil {
			fail(fmt.Errorf("none relay: %w", err))
		}
		fmt.Printf("%-11s %8d %12s %12.0f %7s %8.2f %12.0f %7s %8.2f\n", "none", *n, "-", relay1.rate, "-", relay1.tripsPerBatch, relay2.rate, "-", relay2.tripsPerBatch)
	}
	if *broker == "all" || *broker == "kafka" {
		bs := strings.Split(*brokers, ",")
		topic := "idemq-bench-outbox-" + suffix
		if err := kafkasource.CreateTopics(ctx, nil, bs, kafkasource.TopicSpec{Name: topic, Partitions: 8}); err != nil {
			fail(err)
		}
		w := &kafka.Writer{Addr: kafka.TCP(bs...), Balancer: kafka.Murmur2Balancer{}, RequiredAcks: kafka.RequireAll,
			BatchSize: batch, BatchTimeout: time.Millisecond, Transport: &kafka.Transport{}}
		pub, err := kafkaoutbox.New(kafkaoutbox.Config{Brokers: bs})
		if err != nil {
			fail(err)
		}
		run("kafka", *n, topic, func(msgs []outbox.Message) error {
			km := make([]kafka.Message, len(msgs))
			for i, m := range msgs {
				km[i] = kafka.Message{Topic: m.Destination, Key: []byte(m.Key), Value: m.Body,
					Headers: []kafka.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte(m.ID)}}}
			}
			return w.WriteMessages(ctx, km...)
		}, pub)
		// Teardown after the measurement: its errors change no number.
		_ = w.Close()
		_ = pub.Close()
	}
	if *broker == "all" || *broker == "sqs" {
		c, err := sqssource.NewClient(ctx, *sqsURL, config.WithRegion("us-east-1"),
			config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
		if err != nil {
			fail(err)
		}
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("idemq-bench-outbox-" + suffix)})
		if err != nil {
			fail(err)
		}
		q := aws.ToString(out.QueueUrl)
		pub, _ := sqsoutbox.New(c)
		run("sqs", *n/4, q, func(msgs []outbox.Message) error {
			for i := 0; i < len(msgs); i += 10 {
				in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(q)}
				for j, m := range msgs[i:min(i+10, len(msgs))] {
					in.Entries = append(in.Entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), MessageBody: aws.String(string(m.Body)),
						MessageAttributes: map[string]sqstypes.MessageAttributeValue{outbox.HeaderIdempotencyKey: {DataType: aws.String("String"), StringValue: aws.String(m.ID)}}})
				}
				res, err := c.SendMessageBatch(ctx, in)
				if err != nil {
					return err
				}
				if len(res.Failed) > 0 {
					return fmt.Errorf("%d failed", len(res.Failed))
				}
			}
			return nil
		}, pub)
		_, _ = c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(q)})
	}
	if *broker == "all" || *broker == "rabbitmq" {
		conn, err := amqp.Dial(*amqpURL)
		if err != nil {
			fail(err)
		}
		ch, err := conn.Channel()
		if err != nil {
			fail(err)
		}
		queue := "idemq-bench-outbox-" + suffix
		if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
			fail(err)
		}
		if err := ch.Confirm(false); err != nil {
			fail(err)
		}
		pub, _ := amqpoutbox.New(amqpoutbox.Config{URL: *amqpURL})
		// The default exchange routes by queue name, so the key is the queue.
		run("rabbitmq", *n, "", func(msgs []outbox.Message) error {
			dcs := make([]*amqp.DeferredConfirmation, len(msgs))
			for i, m := range msgs {
				dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
					amqp.Publishing{MessageId: m.ID, DeliveryMode: amqp.Persistent, Body: m.Body,
						Headers: amqp.Table{outbox.HeaderIdempotencyKey: m.ID}})
				if err != nil {
					return err
				}
				dcs[i] = dc
			}
			for _, dc := range dcs {
				if ok, err := dc.WaitContext(ctx); err != nil || !ok {
					return fmt.Errorf("not confirmed: %w", err)
				}
			}
			return nil
		}, routeTo{queue: queue, Publisher: pub})
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = pub.Close()
		_ = conn.Close()
	}
}

// confirmAtOnce is a publisher that sends nothing and confirms at once.
type confirmAtOnce struct{}

func (confirmAtOnce) Publish(context.Context, []outbox.Message) error { return nil }

// routeTo publishes through the default exchange to one queue: the key of
// every message becomes the queue's name (the bench's keys stay distinct
// in the outbox, so the relay claims full batches).
type routeTo struct {
	outbox.Publisher
	queue string
}

func (r routeTo) Publish(ctx context.Context, msgs []outbox.Message) error {
	out := make([]outbox.Message, len(msgs))
	for i, m := range msgs {
		m.Key = r.queue
		out[i] = m
	}
	return r.Publisher.Publish(ctx, out)
}

// messages returns count messages to dest over keys partition keys.
func messages(dest string, count int) []outbox.Message {
	suffix := randomSuffix()
	msgs := make([]outbox.Message, count)
	body := []byte(`{"order":"0000000000","amount":4200,"currency":"EUR"}`)
	for i := range msgs {
		msgs[i] = outbox.Message{ID: suffix + "/" + strconv.Itoa(i), Destination: dest, Key: "k-" + strconv.Itoa(i%keys), Body: body}
	}
	return msgs
}

// relayResult is one relay run's measurement.
type relayResult struct {
	rate          float64 // messages per second
	tripsPerBatch float64 // the relay's PostgreSQL round trips per claimed batch
}

// relay commits msgs to the outbox through pool, then times one relay,
// on a traced pool of its own, draining them.
func relay(ctx context.Context, pool *pgxpool.Pool, dsn string, pub outbox.Publisher, msgs []outbox.Message, concurrency int) (relayResult, error) {
	if _, err := pool.Exec(ctx, `TRUNCATE idemq_outbox`); err != nil {
		return relayResult{}, err
	}
	for i := 0; i < len(msgs); i += 1000 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return relayResult{}, err
		}
		for _, m := range msgs[i:min(i+1000, len(msgs))] {
			if _, err := outbox.Publish(ctx, tx, m); err != nil {
				_ = tx.Rollback(ctx)
				return relayResult{}, err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return relayResult{}, err
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE idemq_outbox`); err != nil {
		return relayResult{}, err
	}
	tr := &pgtrace.Counter{}
	rpool, err := tracedPool(ctx, dsn, tr, int32(2*concurrency+2))
	if err != nil {
		return relayResult{}, err
	}
	defer rpool.Close()
	tp := &countingPublisher{Publisher: pub, done: make(chan struct{}), want: int64(len(msgs))}
	r, err := outbox.NewRelay(rpool, tp, outbox.Config{BatchSize: batch, Concurrency: concurrency, Retention: time.Hour,
		PollInterval: 10 * time.Millisecond,
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return relayResult{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	start := time.Now()
	ran := make(chan error, 1)
	tr.Trips.Store(0)
	go pprof.Do(rctx, pprof.Labels("phase", "relay"), func(rctx context.Context) { ran <- r.Run(rctx) })
	select {
	case <-tp.done:
	case <-time.After(5 * time.Minute):
		cancel()
		return relayResult{}, fmt.Errorf("relay confirmed %d of %d rows in 5 minutes", tp.n.Load(), len(msgs))
	}
	elapsed := time.Since(start)
	trips, batches := tr.Trips.Load(), tp.batches.Load()
	cancel()
	if err := <-ran; err != nil {
		return relayResult{}, fmt.Errorf("relay: %w", err)
	}
	c, err := r.Counts(ctx)
	if err != nil {
		return relayResult{}, err
	}
	if c.Sent != int64(len(msgs)) {
		return relayResult{}, fmt.Errorf("%d of %d rows marked sent", c.Sent, len(msgs))
	}
	return relayResult{rate: float64(len(msgs)) / elapsed.Seconds(), tripsPerBatch: float64(trips) / float64(batches)}, nil
}

// tracedPool opens a pool of size connections on dsn, in the bench's
// schema, whose round trips tr counts.
func tracedPool(ctx context.Context, dsn string, tr *pgtrace.Counter, size int32) (*pgxpool.Pool, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = size
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return pool, pool.Ping(ctx)
}

// countingPublisher closes done once want messages were confirmed, and
// counts the batches it was given.
type countingPublisher struct {
	outbox.Publisher
	want    int64
	n       atomic.Int64
	batches atomic.Int64
	done    chan struct{}
}

func (c *countingPublisher) Publish(ctx context.Context, msgs []outbox.Message) error {
	c.batches.Add(1)
	err := c.Publisher.Publish(ctx, msgs)
	if err == nil && c.n.Add(int64(len(msgs))) == c.want {
		close(c.done)
	}
	return err
}

func openPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	admin, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	_, err = admin.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE; CREATE SCHEMA `+schema)
	admin.Close()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return nil, err
	}
	m, err := migrate.NewPgx(pool, migrate.Config{Line: migrate.Outbox})
	if err != nil {
		return nil, err
	}
	_, err = m.Migrate(ctx)
	return pool, err
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench outbox:", err)
	os.Exit(1)
}
