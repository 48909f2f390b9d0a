// The checkout subcommand: the demo's checkout worker on any broker and
// store, outside the demo's chaos. Orders arrive on a broker, and each one
// debits an account and writes a ledger row in the transaction that also
// records the order's idempotency key, so that every order is charged
// exactly once although the broker delivers at least once.
//
//	go run ./cmd/idemq-demo checkout -publish 1000 -idle 3s                          # in-memory broker, SQLite file
//	go run ./cmd/idemq-demo checkout -broker kafka -store postgres -publish 1000 -idle 3s
//	go run ./cmd/idemq-demo checkout -broker rabbitmq -publish 1000 -idle 3s
//	go run ./cmd/idemq-demo checkout -broker sqs -publish 1000 -idle 3s
//
// Every flag can also be set in the environment (CHECKOUT_BROKER,
// CHECKOUT_STORE, CHECKOUT_SQLITE, DATABASE_URL, KAFKA_BROKERS, AMQP_URL,
// SQS_ENDPOINT; the TEST_* variables of the project's test services work
// too). With -publish it first publishes that many orders, every tenth one
// twice with the same idempotency key (a retrying producer), and one with a
// body that is not JSON (dead-lettered). At the end it prints the runner's
// counters and the ledger: the number of distinct orders charged, their
// total, and the number of orders charged twice, which is always 0. Kill it
// (kill -9) while it runs and start it again without -publish: the ledger is
// still exact.

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/cmd/idemq-demo/internal/checkout"
)

// checkoutOptions are the checkout subcommand's flags.
type checkoutOptions struct {
	broker, store       string
	sqlitePath, dbURL   string
	schema              string
	kafka, amqpURL, sqs string
	topic               string
	publish, accounts   int
	concurrency, batch  int
	idle                time.Duration
	verbose             bool
}

// checkoutArg is the first argument of the checkout subcommand.
const checkoutArg = "checkout"

// runCheckout runs the checkout subcommand with its command-line args.
func runCheckout(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o checkoutOptions
	fs := flag.NewFlagSet("idemq-demo checkout", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.broker, "broker", env("memory", "CHECKOUT_BROKER"), "broker: memory, kafka, sqs or rabbitmq")
	fs.StringVar(&o.store, "store", env("sqlite", "CHECKOUT_STORE"), "store: sqlite or postgres")
	fs.StringVar(&o.sqlitePath, "sqlite", env("checkout.db", "CHECKOUT_SQLITE"), "SQLite file of the sqlite store")
	fs.StringVar(&o.dbURL, "db", "", "PostgreSQL URL of the postgres store (default: $DATABASE_URL, else $TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable)")
	fs.StringVar(&o.schema, "schema", "checkout", "PostgreSQL schema of the postgres store")
	fs.StringVar(&o.kafka, "kafka", env("127.0.0.1:9092", "KAFKA_BROKERS", "TEST_KAFKA_BROKERS"), "comma-separated Kafka bootstrap brokers")
	fs.StringVar(&o.amqpURL, "amqp", "", "RabbitMQ URL (default: $AMQP_URL, else $TEST_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/)")
	fs.StringVar(&o.sqs, "sqs", env("http://127.0.0.1:9324", "SQS_ENDPOINT", "TEST_SQS_ENDPOINT"), `SQS endpoint ("" for AWS)`)
	fs.StringVar(&o.topic, "topic", "checkout-orders", "Kafka topic, SQS queue or RabbitMQ queue")
	fs.IntVar(&o.publish, "publish", 0, "publish this many orders before consuming")
	fs.IntVar(&o.accounts, "accounts", 50, "number of accounts")
	fs.IntVar(&o.concurrency, "concurrency", 4, "batches handled at once")
	fs.IntVar(&o.batch, "batch", 20, "orders per transaction")
	fs.DurationVar(&o.idle, "idle", 0, "exit after no order arrived for this long (0: run until interrupted)")
	fs.BoolVar(&o.verbose, "v", false, "log the runner's and the source's messages")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	// URLs may carry passwords: they come from the environment after
	// parsing, so that -h never prints them.
	if o.dbURL == "" {
		o.dbURL = env("postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable", "DATABASE_URL", "TEST_DATABASE_URL")
	}
	if o.amqpURL == "" {
		o.amqpURL = env("amqp://guest:guest@127.0.0.1:5672/", "AMQP_URL", "TEST_AMQP_URL")
	}
	if o.broker == checkout.BrokerMemory && o.idle == 0 {
		o.idle = 3 * time.Second // nothing else can publish to an in-process broker
	}

	return runCheckoutWorker(ctx, o, stdout)
}

// runCheckoutWorker runs the checkout worker as o says, and checks the
// ledger at the end.
func runCheckoutWorker(ctx context.Context, o checkoutOptions, out io.Writer) error {
	logger := slog.New(slog.DiscardHandler)
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	setup, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	var store checkout.Store
	var err error
	switch o.store {
	case "sqlite":
		store, err = checkout.OpenSQLite(setup, o.sqlitePath, o.accounts)
	case "postgres":
		store, err = checkout.OpenPostgres(setup, o.dbURL, o.schema, o.accounts)
	default:
		err = fmt.Errorf("unknown store %q (want sqlite or postgres)", o.store)
	}
	if err != nil {
		return err
	}
	defer store.Close()

	broker, err := checkout.OpenBroker(setup, checkout.BrokerConfig{
		Kind: o.broker, KafkaBrokers: strings.Split(o.kafka, ","), AMQPURL: o.amqpURL, SQSEndpoint: o.sqs,
		Topic: o.topic, Logger: logger,
	})
	if err != nil {
		return err
	}
	defer broker.Close()

	if o.publish > 0 {
		if err := publishOrders(setup, broker, o); err != nil {
			return err
		}
		fmt.Fprintf(out, "published %d orders (%d of them twice) and 1 malformed order\n", o.publish, (o.publish+9)/10)
	}
	st, err := checkout.Run(ctx, checkout.WorkerConfig{
		Broker: broker, Store: store, Concurrency: o.concurrency, BatchSize: o.batch, Idle: o.idle, Logger: logger,
	})
	if err != nil {
		return err
	}
	l, err := store.Ledger(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "this run: received %d, charged %d, duplicates absorbed %d, retried %d, dead-lettered %d\n",
		st.Received, st.Handled, st.Duplicates, st.Retried, st.DeadLettered)
	fmt.Fprintf(out, "ledger: %d orders charged, %d cents in total, %d charged twice; accounts debited %d cents\n",
		l.Orders, l.Total, l.DoubleCharged, l.Debited)
	if l.DoubleCharged != 0 || l.Rows != l.Orders || l.Debited != l.Total {
		return errors.New("the ledger is inconsistent")
	}
	return nil
}

// publishOrders sends o.publish orders of a fresh run, every tenth twice, and one
// malformed body. With RabbitMQ the queue is declared by the first source,
// so one is opened (and closed) first.
func publishOrders(ctx context.Context, b checkout.Broker, o checkoutOptions) error {
	if o.broker == checkout.BrokerRabbitMQ {
		rc := checkout.WorkerConfig{}.RunnerConfig()
		src, err := b.Source(ctx, &rc)
		if err != nil {
			return err
		}
		_ = src.Close()
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	run := "order-" + hex.EncodeToString(id[:])
	var msgs []checkout.Outgoing
	for n := range o.publish {
		m := checkout.SampleOrder(run, n, o.accounts).Message()
		msgs = append(msgs, m)
		if n%10 == 0 {
			msgs = append(msgs, m) // the producer retried
		}
	}
	msgs = append(msgs, checkout.Outgoing{Key: run + "-malformed", Body: []byte("{not json"), PartitionKey: checkout.AccountID(0)})
	return b.Publish(ctx, msgs...)
}
