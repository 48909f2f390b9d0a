// Command kafka-worker is a small payments worker on Kafka and PostgreSQL: it
// consumes payment messages from a topic and credits accounts, each payment
// exactly once in effect, although Kafka delivers at least once (after a
// crash, a rebalance or a failed offset commit) and the producer sends some
// payments twice.
//
//	bash testdata/services/services.sh up postgres kafka
//	go run ./examples/kafka-worker -publish 1000 -idle 2s
//
// With -publish it first publishes that many payments (every tenth one a
// second time, as a retrying producer would, and one payment to an unknown
// account), then it runs until interrupted, or until nothing arrived for
// -idle. It prints the runner's counters and the money credited, which equals
// the sum of the distinct payments however often they were delivered. Kill it
// (kill -9) in the middle and start it again: the total is still exact.
//
// The handler is one UPDATE inside the transaction that also records the
// payment's key (consumer.Transactional with dedup/pgdedup); the offset is
// committed only after that transaction committed, and only up to the first
// payment of each partition that is not done yet. The Kafka message key is
// the account, so the payments of one account are applied in order. A payment
// to an unknown account is poison: it goes to the topic "<topic>.dlq" with the
// reason in its idemq-reason header.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/kafkasource"
)

// Payment is the message body.
type Payment struct {
	Account int   `json:"account"`
	Amount  int64 `json:"amount"` // cents
}

// options configure one run of the worker.
type options struct {
	brokers            []string
	databaseURL        string
	topic, group       string
	schema             string
	partitions         int
	accounts           int
	publish            int
	idle               time.Duration
	concurrency, batch int
	log                *slog.Logger
}

func main() {
	o := options{log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()}))}
	brokers := flag.String("brokers", envOr("TEST_KAFKA_BROKERS", "127.0.0.1:9092"), "comma-separated Kafka bootstrap brokers")
	flag.StringVar(&o.databaseURL, "db", "", "PostgreSQL URL (default: $TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable)")
	flag.StringVar(&o.topic, "topic", "idemq.example.payments", "topic to consume (created if missing, with <topic>.dlq)")
	flag.StringVar(&o.group, "group", "idemq-example-billing", "consumer group, also the deduplication scope")
	flag.StringVar(&o.schema, "schema", "idemq_example_kafka", "PostgreSQL schema for the accounts and the dedup records")
	flag.IntVar(&o.partitions, "partitions", 4, "partitions of the topic when it is created")
	flag.IntVar(&o.accounts, "accounts", 100, "number of accounts")
	flag.IntVar(&o.publish, "publish", 0, "publish this many payments before consuming")
	flag.DurationVar(&o.idle, "idle", 0, "exit after nothing arrived for this long (0: run until interrupted)")
	flag.IntVar(&o.concurrency, "concurrency", 4, "batches handled at once")
	flag.IntVar(&o.batch, "batch", 50, "messages per transaction")
	flag.Parse()
	if o.databaseURL == "" {
		o.databaseURL = envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable")
	}
	o.brokers = strings.Split(*brokers, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kafka-worker:", err)
		os.Exit(1)
	}
}

// run sets up the topic and the database, publishes if asked, and consumes
// until ctx is done or the topic was idle for o.idle.
func run(ctx context.Context, o options, out io.Writer) error {
	setupCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := kafkasource.CreateTopics(setupCtx, nil, o.brokers,
		kafkasource.TopicSpec{Name: o.topic, Partitions: o.partitions},
		kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(o.topic), Partitions: 1},
	); err != nil {
		return err
	}
	poolCfg, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return err
	}
	// A connection per lane, plus room for the janitor and queries outside
	// a lane's transaction: the runner refuses a smaller pool.
	poolCfg.MaxConns = int32(o.concurrency + 2)
	pool, err := pgxpool.NewWithConfig(setupCtx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := setupDatabase(setupCtx, pool, o.schema, o.accounts)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if o.publish > 0 {
		twice, err := publish(setupCtx, o)
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		fmt.Fprintf(out, "published %d payments (%d of them twice) and 1 to an unknown account\n", o.publish, twice)
	}

	src, err := kafkasource.New(ctx, kafkasource.Config{
		Brokers: o.brokers,
		Topics:  []string{o.topic},
		GroupID: o.group,
		// Leave the group fast when killed, so a restart takes over soon.
		SessionTimeout:    10 * time.Second,
		HeartbeatInterval: time.Second,
		Logger:            o.log,
	})
	if err != nil {
		return err
	}
	defer src.Close()

	accounts := pgx.Identifier{o.schema, "accounts"}.Sanitize()
	credit := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, p Payment) error {
		tag, err := tx.Exec(ctx, `UPDATE `+accounts+` SET balance = balance + $1 WHERE id = $2`, p.Amount, p.Account)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return consumer.Permanent(fmt.Errorf("unknown account %d", p.Account))
		}
		return nil
	})
	runner, err := consumer.NewRunner(src, consumer.Transactional(store, credit), consumer.Config{
		Name:        o.group,
		Concurrency: o.concurrency,
		BatchSize:   o.batch,
		Logger:      o.log,
	})
	if err != nil {
		return err
	}

	runCtx, stopRunner := context.WithCancel(ctx)
	defer stopRunner()
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()
	if o.idle > 0 {
		go stopWhenIdle(runCtx, stopRunner, runner, src, o.idle)
	}
	if err := <-done; err != nil {
		return err
	}

	st := runner.Stats()
	var total int64
	if err := pool.QueryRow(context.WithoutCancel(ctx), `SELECT coalesce(sum(balance), 0) FROM `+accounts).Scan(&total); err != nil {
		return err
	}
	fmt.Fprintf(out, "handled %d, duplicates %d, retried %d, dead-lettered %d, rebalances %d\n",
		st.Handled, st.Duplicates, st.Retried, st.DeadLettered, src.Stats().Rebalances)
	fmt.Fprintf(out, "credited in total: %d cents\n", total)
	return nil
}

// stopWhenIdle calls stop once the source has joined its group and no message
// arrived for idle.
func stopWhenIdle(ctx context.Context, stop context.CancelFunc, r *consumer.Runner, src *kafkasource.Source, idle time.Duration) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last uint64
	var since time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if src.Stats().Rebalances == 0 {
			continue // not in the group yet
		}
		st := r.Stats()
		switch n := st.Received; {
		case n != last || since.IsZero():
			last, since = n, time.Now()
		case time.Since(since) >= idle && src.Stats().InFlight == 0:
			stop()
			return
		}
	}
}

// setupDatabase creates the schema, the accounts and the dedup table.
func setupDatabase(ctx context.Context, pool *pgxpool.Pool, schema string, accounts int) (*pgdedup.Store, error) {
	ident := pgx.Identifier{schema}.Sanitize()
	for _, sql := range []string{
		`CREATE SCHEMA IF NOT EXISTS ` + ident,
		`CREATE TABLE IF NOT EXISTS ` + ident + `.accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`,
		`INSERT INTO ` + ident + `.accounts (id) SELECT generate_series(1, ` + strconv.Itoa(accounts) + `) ON CONFLICT DO NOTHING`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return nil, err
		}
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	return store, store.Migrate(ctx)
}

// publish writes o.publish payments with unique keys (every tenth twice) and
// one payment to an unknown account, and returns how many were sent twice.
func publish(ctx context.Context, o options) (twice int, err error) {
	run := make([]byte, 4)
	_, _ = rand.Read(run)
	prefix := "payment-" + hex.EncodeToString(run) + "-"
	w := &kafka.Writer{
		Addr:         kafka.TCP(o.brokers...),
		Topic:        o.topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
		Transport:    &kafka.Transport{}, // fresh metadata: the topic may be new
	}
	defer w.Close()
	message := func(key string, p Payment) kafka.Message {
		body, _ := json.Marshal(p)
		return kafka.Message{
			Key:     []byte(strconv.Itoa(p.Account)), // orders one account's payments
			Value:   body,
			Headers: []kafka.Header{{Key: kafkasource.DefaultKeyHeader, Value: []byte(key)}},
		}
	}
	var msgs []kafka.Message
	for n := range o.publish {
		m := message(prefix+strconv.Itoa(n), Payment{Account: 1 + n%o.accounts, Amount: int64(100 + n%7)})
		msgs = append(msgs, m)
		if n%10 == 0 {
			msgs = append(msgs, m) // the producer retried
			twice++
		}
	}
	msgs = append(msgs, message(prefix+"unknown", Payment{Account: -1, Amount: 1}))
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return 0, err
	}
	return twice, nil
}

func logLevel() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(os.Getenv("IDEMQ_LOG"))); err != nil {
		return slog.LevelWarn
	}
	return l
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
