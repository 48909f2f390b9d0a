// Command sqs-worker is a small payments worker on Amazon SQS and PostgreSQL:
// it consumes payment messages from a queue and credits accounts, each
// payment exactly once in effect, although SQS delivers at least once.
//
//	bash testdata/services/services.sh up postgres elasticmq
//	go run ./examples/sqs-worker -publish 1000 -idle 2s
//
// With -publish it first publishes that many payments (and every tenth one a
// second time, as a producer that retries would: a new SQS message with the
// same payment-id attribute), then it runs until interrupted, or until the
// queue was idle for -idle. It prints the runner's counters and the money
// credited, which equals the sum of the distinct payments however often they
// were delivered. Kill it (kill -9) in the middle and start it again: the
// total is still exact.
//
// The handler is one UPDATE inside the transaction that also records the
// payment's key (consumer.Transactional with dedup/pgdedup); the message is
// deleted only after that transaction committed. The key is the payment-id
// message attribute (sqssource.Config.KeyAttribute). A payment to an unknown
// account is poison: it goes to the dead-letter queue "<queue>-dlq" with the
// reason in its idemq-reason attribute.
//
// By default it talks to the local SQS emulator, with the region and dummy
// credentials sqssource.NewClient uses for a local endpoint when none are
// configured. Pass -endpoint "" to use real SQS through the default AWS
// configuration chain (AWS_REGION, AWS_PROFILE, instance roles, ...).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/sqssource"
)

// keyAttribute is the message attribute that carries a payment's id, the
// deduplication key.
const keyAttribute = "payment-id"

// Payment is the message body.
type Payment struct {
	Account int   `json:"account"`
	Amount  int64 `json:"amount"` // cents
}

// options configure one run of the worker.
type options struct {
	endpoint, databaseURL string
	queue, schema         string
	accounts              int
	publish               int
	idle                  time.Duration
	concurrency, batch    int
	log                   *slog.Logger
	// settled, if set, holds off the idle exit until it reports true for
	// the runner's counters: a test's way to wait out messages that SQS
	// hid for a receive whose response was lost (they come back after
	// their visibility timeout).
	settled func(consumer.Stats) bool
}

func main() {
	o := options{log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()}))}
	flag.StringVar(&o.endpoint, "endpoint", envOr("TEST_SQS_ENDPOINT", "http://127.0.0.1:9324"), `SQS endpoint; "" for AWS`)
	flag.StringVar(&o.databaseURL, "db", "", "PostgreSQL URL (default: $TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable)")
	flag.StringVar(&o.queue, "queue", "idemq-example-payments", "queue to consume (created if missing, with <queue>-dlq)")
	flag.StringVar(&o.schema, "schema", "idemq_example", "PostgreSQL schema for the accounts and the dedup records")
	flag.IntVar(&o.accounts, "accounts", 100, "number of accounts")
	flag.IntVar(&o.publish, "publish", 0, "publish this many payments before consuming")
	flag.DurationVar(&o.idle, "idle", 0, "exit after the queue was idle this long (0: run until interrupted)")
	flag.IntVar(&o.concurrency, "concurrency", 4, "batches handled at once")
	flag.IntVar(&o.batch, "batch", 10, "messages per transaction")
	flag.Parse()
	if o.databaseURL == "" {
		o.databaseURL = envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sqs-worker:", err)
		os.Exit(1)
	}
}

// run sets up the schema and the queues, publishes if asked, and consumes
// until ctx is done or the queue was idle for o.idle.
func run(ctx context.Context, o options, out io.Writer) error {
	client, err := sqssource.NewClient(ctx, o.endpoint)
	if err != nil {
		return err
	}
	queueURL, dlqURL, err := createQueues(ctx, client, o.queue)
	if err != nil {
		return err
	}

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

	src, err := sqssource.New(ctx, client, sqssource.Config{
		QueueURL:           queueURL,
		DeadLetterQueueURL: dlqURL,
		KeyAttribute:       keyAttribute,
		// Payments to one account go to one lane, so that concurrent
		// batches never lock accounts in crossing orders.
		PartitionKeyAttribute: "account",
		Logger:                o.log,
	})
	if err != nil {
		return err
	}
	defer src.Close()

	if o.publish > 0 {
		if err := publish(ctx, client, queueURL, o); err != nil {
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
	r, err := consumer.NewRunner(src, consumer.Transactional(store, credit), consumer.Config{
		Name:        "payments",
		Concurrency: o.concurrency,
		BatchSize:   o.batch,
		Logger:      o.log,
	})
	if err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.idle > 0 {
		go func() {
			for o.settled != nil && !o.settled(r.Stats()) {
				select {
				case <-runCtx.Done():
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
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
	s, ss := r.Stats(), src.Stats()
	fmt.Fprintf(out, "handled %d, duplicates %d, retried %d, dead-lettered %d, visibility extensions %d\n",
		s.Handled, s.Duplicates, s.Retried, s.DeadLettered, ss.Extended)
	fmt.Fprintf(out, "credited in total: %d cents\n", total)
	return nil
}

// createQueues creates the queue and its dead-letter queue if missing and
// returns their URLs.
func createQueues(ctx context.Context, client *sqs.Client, name string) (queueURL, dlqURL string, err error) {
	create := func(name string) (string, error) {
		out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
		if err != nil {
			return "", fmt.Errorf("create queue %s: %w", name, err)
		}
		return aws.ToString(out.QueueUrl), nil
	}
	if dlqURL, err = create(name + "-dlq"); err != nil {
		return "", "", err
	}
	if queueURL, err = create(name); err != nil {
		return "", "", err
	}
	return queueURL, dlqURL, nil
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

// publish sends o.publish payments with payment-id "payment-<n>", every
// tenth one twice, 10 per SendMessageBatch.
func publish(ctx context.Context, client *sqs.Client, queueURL string, o options) error {
	var entries []types.SendMessageBatchRequestEntry
	flush := func() error {
		if len(entries) == 0 {
			return nil
		}
		out, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
		if err == nil && len(out.Failed) > 0 {
			err = fmt.Errorf("%d payments not sent: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
		entries = entries[:0]
		return err
	}
	add := func(n int) error {
		p := Payment{Account: 1 + n%o.accounts, Amount: int64(100 + n%7)}
		body, err := json.Marshal(p)
		if err != nil {
			return err
		}
		entries = append(entries, types.SendMessageBatchRequestEntry{
			Id:          aws.String(strconv.Itoa(len(entries))),
			MessageBody: aws.String(string(body)),
			MessageAttributes: map[string]types.MessageAttributeValue{
				keyAttribute: {DataType: aws.String("String"), StringValue: aws.String("payment-" + strconv.Itoa(n))},
				"account":    {DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(p.Account))},
			},
		})
		if len(entries) == sqssource.MaxBatch {
			return flush()
		}
		return nil
	}
	for n := range o.publish {
		if err := add(n); err != nil {
			return err
		}
		if n%10 == 0 {
			if err := add(n); err != nil { // the producer retried
				return err
			}
		}
	}
	return flush()
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
