// Command amqp measures the RabbitMQ source against a raw consumer, in one
// run on the same broker and database:
//
//   - raw: an amqp091-go consumer that acknowledges every delivery at once
//     (manual ack, no handler, no database), as most consumers do; and the
//     same with one multiple-ack per 100 deliveries, the broker's ceiling;
//   - amqpsource Receive+Ack: the Source alone, acknowledging what it
//     receives (no handler, no database): the adapter's cost;
//   - the idemq Runner with a one-UPDATE handler (an accounts row per
//     message, the dedup record in the same transaction) at batch 1 and at
//     batch 100.
//
// Each workload consumes its own pre-filled durable queue; publishing is not
// timed. Run it with
//
//	go run ./internal/bench/amqp
//
// after `bash testdata/services/services.sh up postgres rabbitmq`;
// TEST_AMQP_URL and TEST_DATABASE_URL select other servers.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/amqpsource"
)

const schema = "idemq_bench_amqp"

type order struct {
	Account int   `json:"account"`
	Amount  int64 `json:"amount"`
}

type options struct {
	amqpURL, dsn          string
	rawN, b1N, b100N      int
	concurrency, accounts int
	quorum                bool
}

func main() {
	var o options
	flag.StringVar(&o.amqpURL, "amqp", envOr("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.StringVar(&o.dsn, "dsn", envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable"), "PostgreSQL URL")
	flag.IntVar(&o.rawN, "raw", 50000, "messages for the raw consumer and the bare source")
	flag.IntVar(&o.b1N, "n1", 3000, "messages for the runner at batch 1")
	flag.IntVar(&o.b100N, "n100", 30000, "messages for the runner at batch 100")
	flag.IntVar(&o.concurrency, "concurrency", 4, "Runner.Concurrency")
	flag.IntVar(&o.accounts, "accounts", 1000, "rows in the accounts table")
	flag.BoolVar(&o.quorum, "quorum", false, "use quorum queues instead of classic queues")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type result struct {
	name string
	n    int
	d    time.Duration
}

func (r result) rate() float64 { return float64(r.n) / r.d.Seconds() }

func run(ctx context.Context, o options) error {
	pool, store, err := setupDatabase(ctx, o)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) //nolint:errcheck // best effort
	conn, err := amqp.Dial(o.amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()

	queueType := amqpsource.QueueTypeClassic
	if o.quorum {
		queueType = amqpsource.QueueTypeQuorum
	}
	var fsync string
	_ = pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&fsync)
	fmt.Printf("RabbitMQ source benchmark: %s queues, persistent messages, Runner concurrency %d, %d accounts, synchronous_commit=%s\n\n",
		queueType, o.concurrency, o.accounts, fsync)

	var results []result
	var queues []string
	defer func() {
		if ch, err := conn.Channel(); err == nil {
			for _, q := range queues {
				_, _ = ch.QueueDelete(q, false, false, false)
				_, _ = ch.QueueDelete(q+".dlq", false, false, false)
			}
			_ = ch.Close()
		}
	}()
	fill := func(name string, n int) (string, error) {
		q := "idemq.bench." + name + "." + randHex()
		queues = append(queues, q)
		if err := declare(ctx, o, q, queueType); err != nil {
			return "", err
		}
		return q, publish(ctx, conn, q, n, o.accounts)
	}

	// Raw consumer: ack every delivery as it arrives.
	prefetch100 := amqpsource.PrefetchFor(consumer.Config{Concurrency: o.concurrency, BatchSize: 100})
	q, err := fill("raw", o.rawN)
	if err != nil {
		return err
	}
	d, err := raw(ctx, conn, q, o.rawN, prefetch100, 1)
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	results = append(results, result{"raw amqp091 consume + ack each", o.rawN, d})
	if q, err = fill("rawmulti", o.rawN); err != nil {
		return err
	}
	if d, err = raw(ctx, conn, q, o.rawN, prefetch100, 100); err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	results = append(results, result{"raw amqp091 consume + multiple-ack / 100", o.rawN, d})

	// The Source alone.
	if q, err = fill("source", o.rawN); err != nil {
		return err
	}
	if d, err = bareSource(ctx, o, q, prefetch100); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	results = append(results, result{"amqpsource Receive + Ack (no handler)", o.rawN, d})

	// The Runner with the one-UPDATE handler.
	for _, r := range []struct {
		name  string
		n     int
		batch int
	}{
		{"idemq runner, one UPDATE, batch 1", o.b1N, 1},
		{"idemq runner, one UPDATE, batch 100", o.b100N, 100},
	} {
		if q, err = fill("b"+strconv.Itoa(r.batch), r.n); err != nil {
			return err
		}
		d, err := runner(ctx, o, q, store, r.n, r.batch)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		results = append(results, result{r.name, r.n, d})
	}

	var total int64
	if err := pool.QueryRow(ctx, `SELECT sum(balance) FROM `+schema+`.accounts`).Scan(&total); err != nil {
		return err
	}
	if want := int64(o.b1N + o.b100N); total != want {
		return fmt.Errorf("effects: sum of balances %d, want %d (each message applied once)", total, want)
	}

	base := results[0].rate()
	fmt.Printf("%-42s %9s %9s %11s %9s\n", "workload", "messages", "seconds", "msg/s", "vs raw")
	for _, r := range results {
		fmt.Printf("%-42s %9d %9.2f %11.0f %8.3fx\n", r.name, r.n, r.d.Seconds(), r.rate(), r.rate()/base)
	}
	b1, b100, ceiling := results[3], results[4], results[1]
	fmt.Printf("\nrunner batch 100 vs batch 1: %.1fx\n", b100.rate()/b1.rate())
	fmt.Printf("runner vs raw ack-each:       batch 1 %.3fx, batch 100 %.3fx\n", b1.rate()/base, b100.rate()/base)
	fmt.Printf("runner vs raw multiple-ack:   batch 1 %.3fx, batch 100 %.3fx\n", b1.rate()/ceiling.rate(), b100.rate()/ceiling.rate())
	fmt.Printf("effects: sum of balances = %d = messages applied once each\n", total)
	return nil
}

func setupDatabase(ctx context.Context, o options) (*pgxpool.Pool, *pgdedup.Store, error) {
	cfg, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = int32(o.concurrency + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range []string{
		`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`,
		`CREATE SCHEMA ` + schema,
		`CREATE TABLE ` + schema + `.accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`,
		fmt.Sprintf(`INSERT INTO %s.accounts (id) SELECT generate_series(0, %d)`, schema, o.accounts-1),
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("%s: %w", s, err)
		}
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, store, nil
}

// declare declares q (and its dead-letter queue) through amqpsource.
func declare(ctx context.Context, o options, q, queueType string) error {
	src, err := amqpsource.New(ctx, amqpsource.Config{URL: o.amqpURL, Queue: q, Declare: &amqpsource.Topology{QueueType: queueType}})
	if err != nil {
		return err
	}
	return src.Close()
}

// publish publishes n persistent orders to q, each keyed and partitioned by
// account, and waits for the confirms.
func publish(ctx context.Context, conn *amqp.Connection, q string, n, accounts int) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	const window = 1000
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	wait := func() error {
		for _, dc := range pending {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				return errors.Join(errors.New("publish not confirmed"), err)
			}
		}
		pending = pending[:0]
		return nil
	}
	for i := range n {
		acct := i % accounts
		body, _ := json.Marshal(order{Account: acct, Amount: 1})
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{
			Headers: amqp.Table{
				amqpsource.DefaultKeyHeader: q + "-" + strconv.Itoa(i),
				"account":                   strconv.Itoa(acct),
			},
			DeliveryMode: amqp.Persistent,
			Body:         body,
		})
		if err != nil {
			return err
		}
		if pending = append(pending, dc); len(pending) == window {
			if err := wait(); err != nil {
				return err
			}
		}
	}
	return wait()
}

// raw consumes n deliveries from q and acknowledges them every ackEvery
// deliveries (a multiple-ack when ackEvery > 1).
func raw(ctx context.Context, conn *amqp.Connection, q string, n, prefetch, ackEvery int) (time.Duration, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return 0, err
	}
	start := time.Now()
	deliveries, err := ch.ConsumeWithContext(ctx, q, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	for i := 0; i < n; i++ {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return 0, errors.New("delivery channel closed")
			}
			if (i+1)%ackEvery == 0 || i == n-1 {
				if err := d.Ack(ackEvery > 1); err != nil {
					return 0, err
				}
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return time.Since(start), nil
}

// bareSource receives n messages through amqpsource and acknowledges each
// batch Receive returned.
func bareSource(ctx context.Context, o options, q string, prefetch int) (time.Duration, error) {
	start := time.Now()
	src, err := amqpsource.New(ctx, amqpsource.Config{URL: o.amqpURL, Queue: q, Prefetch: prefetch})
	if err != nil {
		return 0, err
	}
	defer src.Close()
	for got := 0; got < o.rawN; {
		msgs, err := src.Receive(ctx, 100)
		if err != nil {
			return 0, err
		}
		if err := src.Ack(ctx, msgs); err != nil {
			return 0, err
		}
		got += len(msgs)
	}
	return time.Since(start), nil
}

// runner runs the idemq Runner with the one-UPDATE handler over q until n
// messages are handled.
func runner(ctx context.Context, o options, q string, store *pgdedup.Store, n, batch int) (time.Duration, error) {
	rc := consumer.Config{
		Name: "bench-amqp", Concurrency: o.concurrency, BatchSize: batch,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	start := time.Now()
	src, err := amqpsource.New(ctx, amqpsource.Config{
		URL: o.amqpURL, Queue: q, Prefetch: amqpsource.PrefetchFor(rc),
		PartitionKeyHeader: "account", // batches never lock accounts in crossing orders
	})
	if err != nil {
		return 0, err
	}
	defer src.Close()
	handler := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, v order) error {
		_, err := tx.Exec(ctx, `UPDATE `+schema+`.accounts SET balance = balance + $1 WHERE id = $2`, v.Amount, v.Account)
		return err
	})
	r, err := consumer.NewRunner(src, consumer.Transactional(store, handler), rc)
	if err != nil {
		return 0, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for r.Stats().Handled < uint64(n) {
		select {
		case <-tick.C:
		case err := <-done:
			cancel()
			return 0, fmt.Errorf("runner stopped early: %v", err)
		}
	}
	d := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	if s := r.Stats(); s.Retried+s.DeadLettered+s.Duplicates > 0 {
		return 0, fmt.Errorf("unexpected: %+v", s)
	}
	return d, nil
}

func randHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
