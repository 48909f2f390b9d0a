// Command worker is the worker process of the chaos suite (cmd/internal/chaos):
// a small idemq consumer written from the public API only, as a user would
// write it. It consumes items from Kafka, SQS or RabbitMQ and inserts one row
// per item into the table "effects" of its PostgreSQL schema, in the
// transaction that also records the item's key (consumer.Transactional with
// dedup/pgdedup). A body that is not JSON is poison: TxJSON dead-letters it.
//
// With -store redis-cluster it takes the lease path instead
// (consumer.Leased with dedup/redisdedup on the Redis Cluster of
// $TEST_REDIS_CLUSTER_ADDRS): its effect is one webhook call per item
// (sinks/webhook) to -webhook, with the item's idempotency key; a body that
// is not JSON is dead-lettered by consumer.JSON.
//
// The chaos suite SIGKILLs it at random moments; on SIGTERM it drains and
// exits. Every 50 ms, and once more after it stopped, it prints its counters
// as one JSON line on stdout (see report), so that the suite can add up what
// its lives absorbed, even those cut short by a kill.
//
// The PostgreSQL URL comes from $CHAOS_DATABASE_URL (not the command line,
// which every user of the machine can read); the broker addresses from the
// services' environment ($TEST_KAFKA_BROKERS unless -kafka-brokers,
// $TEST_SQS_ENDPOINT, $TEST_AMQP_URL, $TEST_REDIS_CLUSTER_ADDRS).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/sinks/webhook"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sqssource"
)

// Item is the body of a message: its sequence number in the run.
type Item struct {
	N int `json:"n"`
}

// report is the line printed on stdout.
type report struct {
	Received     uint64 `json:"received"`
	Handled      uint64 `json:"handled"`
	Duplicates   uint64 `json:"duplicates"`
	Retried      uint64 `json:"retried"`
	DeadLettered uint64 `json:"dead_lettered"`
	Rebalances   int64  `json:"rebalances"`
	// InFlight is the number of messages received and not yet settled.
	InFlight int  `json:"in_flight"`
	Final    bool `json:"final"`
}

// options are the command-line flags.
type options struct {
	broker      string // kafka, sqs or amqp
	dest        string // topic or queue
	dlq         string // SQS: the dead-letter queue's URL
	keyAttr     string // SQS: the key attribute
	group       string // Kafka consumer group and dedup scope
	schema      string
	app         string // PostgreSQL application_name
	concurrency int
	batch       int
	work        time.Duration // time each handler call takes, inside its transaction
	verbose     bool
	kafka       string        // Kafka bootstrap brokers, comma-separated
	store       string        // pg (transactional path) or redis-cluster (lease path)
	webhook     string        // lease path: the URL of the effect
	lease       time.Duration // lease path: consumer.LeaseOptions.Lease
}

func main() {
	var o options
	flag.StringVar(&o.broker, "broker", "", "kafka, sqs or amqp")
	flag.StringVar(&o.dest, "dest", "", "topic (kafka), queue URL (sqs) or queue (amqp)")
	flag.StringVar(&o.dlq, "dlq", "", "dead-letter queue URL (sqs)")
	flag.StringVar(&o.keyAttr, "key-attribute", "chaos-key", "message attribute holding the key (sqs)")
	flag.StringVar(&o.group, "group", "", "consumer group, also the deduplication scope")
	flag.StringVar(&o.schema, "schema", "", "PostgreSQL schema of the effects and the dedup records")
	flag.StringVar(&o.app, "app", "idemq-chaos-worker", "PostgreSQL application_name")
	flag.IntVar(&o.concurrency, "concurrency", 4, "batches handled at once")
	flag.IntVar(&o.batch, "batch", 20, "messages per transaction")
	flag.DurationVar(&o.work, "work", 0, "time each handler call takes, inside its transaction")
	flag.BoolVar(&o.verbose, "v", false, "log at Debug to stderr")
	flag.StringVar(&o.kafka, "kafka-brokers", os.Getenv("TEST_KAFKA_BROKERS"), "Kafka bootstrap brokers, comma-separated")
	flag.StringVar(&o.store, "store", "pg", "pg (consumer.Transactional, pgdedup) or redis-cluster (consumer.Leased, redisdedup)")
	flag.StringVar(&o.webhook, "webhook", "", "lease path: the webhook each item is sent to")
	flag.DurationVar(&o.lease, "lease", 5*time.Second, "lease path: how long a claim holds without a refresh")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A SIGTERM during the set-up is a stop, not a failure.
	if err := run(ctx, o); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "chaos worker:", err)
		os.Exit(1)
	}
}

// source is what run needs of a source beyond consumer.Source.
type source interface {
	consumer.Source
	Close() error
}

func run(ctx context.Context, o options) error {
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	path, closePath, err := newPath(ctx, o, log)
	if err != nil {
		return err
	}
	defer closePath()

	rc := consumer.Config{
		Name: o.group, Concurrency: o.concurrency, BatchSize: o.batch, Logger: log,
		KeyFunc: consumer.RequireKey,
		Retry:   consumer.RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second},
	}
	var (
		src        source
		rebalances func() int64
		inFlight   func(consumer.Stats) int
	)
	switch o.broker {
	case "kafka":
		k, err := kafkasource.New(ctx, kafkasource.Config{
			Brokers: strings.Split(o.kafka, ","),
			Topics:  []string{o.dest},
			GroupID: o.group,
			// A killed member holds its partitions for the session
			// timeout: the broker's smallest, so kills cost little.
			SessionTimeout:    6 * time.Second,
			HeartbeatInterval: 500 * time.Millisecond,
			RebalanceTimeout:  10 * time.Second,
			JoinGroupBackoff:  500 * time.Millisecond,
			CommitInterval:    200 * time.Millisecond,
			Logger:            log,
		})
		if err != nil {
			return err
		}
		src, rebalances = k, func() int64 { return k.Stats().Rebalances }
		inFlight = func(consumer.Stats) int { return k.Stats().InFlight }
	case "sqs":
		var opts []func(*config.LoadOptions) error
		opts = append(opts, config.WithRegion("us-east-1"),
			config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("local", "local", "")))
		client, err := sqssource.NewClient(ctx, os.Getenv("TEST_SQS_ENDPOINT"), opts...)
		if err != nil {
			return err
		}
		s, err := sqssource.New(ctx, client, sqssource.Config{
			QueueURL: o.dest, DeadLetterQueueURL: o.dlq, KeyAttribute: o.keyAttr,
			// A killed worker's messages come back after this.
			VisibilityTimeout: 3 * time.Second,
			WaitTime:          time.Second,
			Logger:            log,
		})
		if err != nil {
			return err
		}
		src = s
	case "amqp":
		a, err := amqpsource.New(ctx, amqpsource.Config{
			URL:      os.Getenv("TEST_AMQP_URL"),
			Queue:    o.dest,
			Prefetch: amqpsource.PrefetchFor(rc),
			Declare:  &amqpsource.Topology{QueueType: amqpsource.QueueTypeQuorum},
			Logger:   log,
		})
		if err != nil {
			return err
		}
		src = a
	default:
		return fmt.Errorf("unknown broker %q (want kafka, sqs or amqp)", o.broker)
	}
	defer src.Close()
	if rebalances == nil {
		rebalances = func() int64 { return 0 }
	}
	if inFlight == nil {
		// Retried messages come back and are received again.
		inFlight = func(st consumer.Stats) int {
			return int(st.Received) - int(st.Handled+st.Duplicates+st.DeadLettered+st.Retried)
		}
	}

	r, err := consumer.NewRunner(src, path, rc)
	if err != nil {
		return err
	}

	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(final bool) {
		st := r.Stats()
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(report{Received: st.Received, Handled: st.Handled, Duplicates: st.Duplicates,
			Retried: st.Retried, DeadLettered: st.DeadLettered, Rebalances: rebalances(), InFlight: inFlight(st), Final: final})
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for {
		select {
		case err := <-done:
			emit(true)
			if errors.Is(err, context.Canceled) {
				err = nil
			}
			return err
		case <-tick.C:
			emit(false)
		}
	}
}

// newPath returns the runner's path of o.store and what closes its
// clients.
func newPath(ctx context.Context, o options, log *slog.Logger) (consumer.Path, func(), error) {
	work := func(ctx context.Context) error {
		if o.work > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(o.work):
			}
		}
		return nil
	}
	switch o.store {
	case "pg":
		poolCfg, err := pgxpool.ParseConfig(os.Getenv("CHAOS_DATABASE_URL"))
		if err != nil {
			return nil, nil, fmt.Errorf("database URL: %w", err)
		}
		poolCfg.ConnConfig.RuntimeParams["application_name"] = o.app
		poolCfg.MaxConns = int32(o.concurrency + 2)
		pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
		if err != nil {
			return nil, nil, err
		}
		store, err := pgdedup.New(pool, pgdedup.Config{Schema: o.schema})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		effects := pgx.Identifier{o.schema, "effects"}.Sanitize()
		handler := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message, it Item) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` (key, n, worker) VALUES ($1, $2, $3)`, msg.Key, it.N, o.app); err != nil {
				return err
			}
			return work(ctx)
		})
		return consumer.Transactional(store, handler), pool.Close, nil
	case "redis-cluster":
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(os.Getenv("TEST_REDIS_CLUSTER_ADDRS"), ",")})
		store, err := redisdedup.New(rdb, redisdedup.Config{})
		if err != nil {
			_ = rdb.Close()
			return nil, nil, err
		}
		sink, err := webhook.New(webhook.Config{URL: o.webhook, Timeout: 5 * time.Second, Logger: log})
		if err != nil {
			_ = rdb.Close()
			return nil, nil, err
		}
		handler := consumer.JSON(func(ctx context.Context, _ *consumer.Message, it Item) error {
			if err := work(ctx); err != nil {
				return err
			}
			return sink.Send(ctx, webhook.Request{Body: []byte(fmt.Sprintf(`{"n":%d}`, it.N))})
		})
		return consumer.Leased(store, handler, consumer.LeaseOptions{Lease: o.lease}), func() { _ = rdb.Close() }, nil
	}
	return nil, nil, fmt.Errorf("unknown store %q (want pg or redis-cluster)", o.store)
}
