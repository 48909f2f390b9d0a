// Command amqp-worker is a small payments worker on RabbitMQ and PostgreSQL:
// it consumes payment messages from a queue and credits accounts, each
// payment exactly once in effect, although RabbitMQ delivers at least once.
//
//	bash testdata/services/services.sh up postgres rabbitmq
//	go run ./examples/amqp-worker -publish 1000 -idle 2s
//
// With -publish it first publishes that many payments (and every tenth one a
// second time, as a producer that retries would), then it runs until
// interrupted, or until the queue was idle for -idle. It prints the runner's
// counters and the money credited, which equals the sum of the distinct
// payments however often they were delivered. Kill it (kill -9) in the middle
// and start it again: the total is still exact.
//
// The handler is one UPDATE inside the transaction that also records the
// payment's key (consumer.Transactional with dedup/pgdedup); the message is
// acknowledged only after that transaction committed. A payment to an
// unknown account is poison: it goes to the dead-letter queue
// "<queue>.dlq" with the reason in its idemq-reason header.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/amqpsource"
)

// Payment is the message body.
type Payment struct {
	Account int   `json:"account"`
	Amount  int64 `json:"amount"` // cents
}

// options configure one run of the worker.
type options struct {
	amqpURL, databaseURL string
	queue, schema        string
	accounts             int
	publish              int
	idle                 time.Duration
	concurrency, batch   int
	log                  *slog.Logger
}

func main() {
	o := options{log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()}))}
	flag.StringVar(&o.amqpURL, "amqp", "", "RabbitMQ URL (default: $TEST_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/)")
	flag.StringVar(&o.databaseURL, "db", "", "PostgreSQL URL (default: $TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable)")
	flag.StringVar(&o.queue, "queue", "idemq.example.payments", "queue to consume (declared if missing)")
	flag.StringVar(&o.schema, "schema", "idemq_example", "PostgreSQL schema for the accounts and the dedup records")
	flag.IntVar(&o.accounts, "accounts", 100, "number of accounts")
	flag.IntVar(&o.publish, "publish", 0, "publish this many payments before consuming")
	flag.DurationVar(&o.idle, "idle", 0, "exit after the queue was idle this long (0: run until interrupted)")
	flag.IntVar(&o.concurrency, "concurrency", 4, "batches handled at once")
	flag.IntVar(&o.batch, "batch", 50, "messages per transaction")
	flag.Parse()
	if o.amqpURL == "" {
		o.amqpURL = envOr("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	}
	if o.databaseURL == "" {
		o.databaseURL = envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "amqp-worker:", err)
		os.Exit(1)
	}
}

// run sets up the schema and the queue, publishes if asked, and consumes
// until ctx is done or the queue was idle for o.idle.
func run(ctx context.Context, o options, out io.Writer) error {
	poolCfg, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return err
	}
	// A connection per lane, plus room for the janitor and queries outside
	// a lane's transaction: the runner refuses a smaller pool.
	poolCfg.MaxConns = int32(o.concurrency + 2)
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := setupDatabase(ctx, pool, o); err != nil {
		return err
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: o.schema})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}

	rc := consumer.Config{Name: "payments", Concurrency: o.concurrency, BatchSize: o.batch, Logger: o.log}
	src, err := amqpsource.New(ctx, amqpsource.Config{
		URL:      o.amqpURL,
		Queue:    o.queue,
		Prefetch: amqpsource.PrefetchFor(rc),
		// Payments to one account go to one lane, so that concurrent
		// batches never lock accounts in crossing orders.
		PartitionKeyHeader: "account",
		Declare:            &amqpsource.Topology{QueueType: amqpsource.QueueTypeQuorum},
		Logger:             o.log,
	})
	if err != nil {
		return err
	}
	defer src.Close()
	rc.KeyFunc = consumer.RequireKey

	if o.publish > 0 {
		if err := publish(ctx, o); err != nil {
			return err
		}
		fmt.Fprintf(out, "published %d payments (%d of them twice)\n", o.publish, (o.publish+9)/10)
	}

	table := pgx.Identifier{o.schema, "accounts"}.Sanitize()
	credit := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, p Payment) error {
		tag, err := tx.Exec(ctx, `UPDATE `+table+` SET balance = balance + $1 WHERE id = $2`, p.Amount, p.Account)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return consumer.Permanent(fmt.Errorf("unknown account %d", p.Account))
		}
		return nil
	})
	r, err := consumer.NewRunner(src, consumer.Transactional(store, credit), rc)
	if err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.idle > 0 {
		go func() {
			if r.WaitIdle(runCtx, o.idle) == nil {
				cancel()
			}
		}()
	}
	if err := r.Run(runCtx); err != nil {
		return err
	}

	var total int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0) FROM `+table).Scan(&total); err != nil {
		return err
	}
	s := r.Stats()
	fmt.Fprintf(out, "handled %d, duplicates %d, retried %d, dead-lettered %d, reconnects %d\n",
		s.Handled, s.Duplicates, s.Retried, s.DeadLettered, src.Stats().Reconnects)
	fmt.Fprintf(out, "credited in total: %d cents\n", total)
	return nil
}

// setupDatabase creates the schema and the accounts (balance 0) if missing.
func setupDatabase(ctx context.Context, pool *pgxpool.Pool, o options) error {
	schema := pgx.Identifier{o.schema}.Sanitize()
	table := pgx.Identifier{o.schema, "accounts"}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema)
	if err == nil {
		_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`)
	}
	if err == nil {
		_, err = pool.Exec(ctx, `INSERT INTO `+table+` (id) SELECT generate_series(1, $1) ON CONFLICT DO NOTHING`, o.accounts)
	}
	if err != nil {
		return fmt.Errorf("set up schema %s: %w", o.schema, err)
	}
	return nil
}

// publish publishes o.publish payments with keys "payment-<n>", every tenth
// one twice, and waits for the broker's confirms.
func publish(ctx context.Context, o options) error {
	conn, err := dial(o.amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	var confirms []*amqp.DeferredConfirmation
	send := func(n int) error {
		p := Payment{Account: 1 + n%o.accounts, Amount: int64(100 + n%7)}
		body, err := json.Marshal(p)
		if err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", o.queue, true, false, amqp.Publishing{
			Headers: amqp.Table{
				amqpsource.DefaultKeyHeader: "payment-" + strconv.Itoa(n),
				"account":                   strconv.Itoa(p.Account),
			},
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			Body:         body,
		})
		confirms = append(confirms, dc)
		return err
	}
	for n := range o.publish {
		if err := send(n); err != nil {
			return err
		}
		if n%10 == 0 {
			if err := send(n); err != nil { // the producer retried
				return err
			}
		}
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return errors.Join(errors.New("publish not confirmed"), err)
		}
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func logLevel() slog.Level {
	if os.Getenv("IDEMQ_LOG") == "debug" {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// dial connects to RabbitMQ at rawURL. The errors of a malformed URL quote
// it, password included, so dial reports the URL redacted instead.
func dial(rawURL string) (*amqp.Connection, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, errors.New("the RabbitMQ URL does not parse")
	}
	conn, err := amqp.Dial(rawURL)
	if err != nil {
		return nil, fmt.Errorf("dialing RabbitMQ at %s: %w", u.Redacted(), err)
	}
	return conn, nil
}
