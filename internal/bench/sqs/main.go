// Command sqs measures the SQS source against the raw SQS API in one run, on
// the same SQS server and PostgreSQL, and prints one table with ratios:
//
//   - raw: receive-and-delete with no handler and no database, the ceiling
//     of the queue (Receivers goroutines, each ReceiveMessage of 10 then
//     DeleteMessageBatch);
//   - idemq: a consumer.Runner over sqssource with the transactional path
//     (pgdedup), the handler doing one UPDATE of an accounts row per message,
//     at database batch size 10 and at larger batch sizes.
//
// Every workload drains its own queue, filled beforehand (the fill is not
// timed). Run it with
//
//	bash testdata/services/services.sh up postgres elasticmq
//	go run ./internal/bench/sqs
//
// TEST_SQS_ENDPOINT and TEST_DATABASE_URL select other servers.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/sqssource"
)

type options struct {
	endpoint, dsn string
	n             int
	receivers     int
	concurrency   int
	batches       []int
	accounts      int
}

func main() {
	var (
		opt     options
		batches string
	)
	flag.StringVar(&opt.endpoint, "endpoint", envOr("TEST_SQS_ENDPOINT", "http://127.0.0.1:9324"), "SQS endpoint")
	flag.StringVar(&opt.dsn, "dsn", envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable"), "PostgreSQL URL")
	flag.IntVar(&opt.n, "n", 20000, "messages per workload")
	flag.IntVar(&opt.receivers, "receivers", 4, "parallel receivers (raw) and sqssource.Config.MaxReceivers")
	flag.IntVar(&opt.concurrency, "concurrency", 4, "consumer.Config.Concurrency")
	flag.StringVar(&batches, "batches", "10,50,100", "consumer.Config.BatchSize values, comma-separated")
	flag.IntVar(&opt.accounts, "accounts", 1000, "rows in the accounts table")
	flag.Parse()
	for _, f := range strings.Split(batches, ",") {
		b, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || b < 1 {
			fmt.Fprintf(os.Stderr, "bench: bad -batches value %q\n", f)
			os.Exit(2)
		}
		opt.batches = append(opt.batches, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, opt); err != nil {
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

type bench struct {
	opt    options
	client *sqs.Client
	pool   *pgxpool.Pool
	store  *pgdedup.Store
	schema string
	queues []string
}

func run(ctx context.Context, opt options) error {
	client, err := sqssource.NewClient(ctx, opt.endpoint,
		config.WithRegion("us-east-1"),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("bench", "bench", "")))
	if err != nil {
		return err
	}
	b := &bench{opt: opt, client: client, schema: "idemq_bench_sqs_" + strings.ToLower(rand.Text()[:8])}
	defer b.cleanup()
	if err := b.setupDatabase(ctx); err != nil {
		return err
	}

	var results []result
	raw, err := b.raw(ctx)
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	results = append(results, raw)
	for _, batch := range opt.batches {
		r, err := b.idemq(ctx, batch)
		if err != nil {
			return fmt.Errorf("idemq batch %d: %w", batch, err)
		}
		results = append(results, r)
	}

	fmt.Printf("SQS at %s, PostgreSQL, %d messages per workload, %d receivers, runner concurrency %d\n\n",
		opt.endpoint, opt.n, opt.receivers, opt.concurrency)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "workload\tmessages\tseconds\tmessages/s\tratio to raw\t")
	for _, r := range results {
		fmt.Fprintf(w, "%s\t%d\t%.2f\t%.0f\t%.2f\t\n", r.name, r.n, r.d.Seconds(), r.rate(), r.rate()/raw.rate())
	}
	return w.Flush()
}

func (b *bench) setupDatabase(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(b.opt.dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(b.opt.concurrency + 2)
	if b.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	ident := pgx.Identifier{b.schema}.Sanitize()
	if _, err := b.pool.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		return err
	}
	if b.store, err = pgdedup.New(b.pool, pgdedup.Config{Schema: b.schema}); err != nil {
		return err
	}
	if err := b.store.Migrate(ctx); err != nil {
		return err
	}
	_, err = b.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO %s.accounts SELECT g, 0 FROM generate_series(0, %d) g`, ident, ident, b.opt.accounts-1))
	return err
}

func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, q := range b.queues {
		_, _ = b.client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(q)})
	}
	if b.pool != nil {
		_, _ = b.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{b.schema}.Sanitize()+" CASCADE")
		b.pool.Close()
	}
}

type order struct {
	Account int `json:"account"`
}

// filledQueue creates a queue (and its dead-letter queue) holding n messages.
func (b *bench) filledQueue(ctx context.Context, name string) (queueURL, dlqURL string, err error) {
	name = fmt.Sprintf("bench-%s-%s", name, strings.ToLower(rand.Text()[:8]))
	create := func(n string) (string, error) {
		out, err := b.client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(n)})
		if err != nil {
			return "", err
		}
		b.queues = append(b.queues, aws.ToString(out.QueueUrl))
		return aws.ToString(out.QueueUrl), nil
	}
	if dlqURL, err = create(name + "-dlq"); err != nil {
		return "", "", err
	}
	if queueURL, err = create(name); err != nil {
		return "", "", err
	}
	var (
		wg       sync.WaitGroup
		next     atomic.Int64
		firstErr error
		once     sync.Once
	)
	for range 8 {
		wg.Go(func() {
			for {
				start := int(next.Add(10)) - 10
				if start >= b.opt.n {
					return
				}
				var entries []types.SendMessageBatchRequestEntry
				for i := start; i < min(start+10, b.opt.n); i++ {
					body, _ := json.Marshal(order{Account: i % b.opt.accounts})
					entries = append(entries, types.SendMessageBatchRequestEntry{
						Id: aws.String(strconv.Itoa(i - start)), MessageBody: aws.String(string(body)),
					})
				}
				out, err := b.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
				if err == nil && len(out.Failed) > 0 {
					err = fmt.Errorf("%d entries failed: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return queueURL, dlqURL, firstErr
}

// raw receives and deletes every message with no handler.
func (b *bench) raw(ctx context.Context) (result, error) {
	queueURL, _, err := b.filledQueue(ctx, "raw")
	if err != nil {
		return result{}, err
	}
	var (
		done     atomic.Int64
		wg       sync.WaitGroup
		firstErr error
		once     sync.Once
	)
	start := time.Now()
	for range b.opt.receivers {
		wg.Go(func() {
			for done.Load() < int64(b.opt.n) {
				out, err := b.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
					QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 30,
				})
				if err == nil && len(out.Messages) > 0 {
					entries := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
					for i, m := range out.Messages {
						entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
					}
					var del *sqs.DeleteMessageBatchOutput
					del, err = b.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
					if err == nil {
						done.Add(int64(len(del.Successful)))
					}
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return result{name: "raw receive+delete, no handler", n: b.opt.n, d: time.Since(start)}, firstErr
}

// idemq drains a queue through a Runner whose handler updates one row.
func (b *bench) idemq(ctx context.Context, batch int) (result, error) {
	queueURL, dlqURL, err := b.filledQueue(ctx, fmt.Sprintf("idemq-%d", batch))
	if err != nil {
		return result{}, err
	}
	src, err := sqssource.New(ctx, b.client, sqssource.Config{
		QueueURL:           queueURL,
		DeadLetterQueueURL: dlqURL,
		MaxReceivers:       b.opt.receivers,
		WaitTime:           time.Second,
	})
	if err != nil {
		return result{}, err
	}
	defer src.Close()
	update := fmt.Sprintf(`UPDATE %s.accounts SET balance = balance + 1 WHERE id = $1`, pgx.Identifier{b.schema}.Sanitize())
	handler := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, o order) error {
		_, err := tx.Exec(ctx, update, o.Account)
		return err
	})
	r, err := consumer.NewRunner(src, consumer.Transactional(b.store, handler), consumer.Config{
		Name:        fmt.Sprintf("bench-%d-%s", batch, rand.Text()[:6]),
		Concurrency: b.opt.concurrency,
		BatchSize:   batch,
	})
	if err != nil {
		return result{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- r.Run(runCtx) }()
	for {
		st := r.Stats()
		if src.Stats().Deleted >= uint64(b.opt.n) {
			break
		}
		if st.DeadLettered > 0 || st.CommitFailures > 0 {
			return result{}, fmt.Errorf("runner stats %+v", st)
		}
		select {
		case err := <-errc:
			return result{}, errors.Join(errors.New("runner stopped early"), err)
		case <-ctx.Done():
			return result{}, fmt.Errorf("timed out: %+v", r.Stats())
		case <-time.After(5 * time.Millisecond):
		}
	}
	d := time.Since(start)
	stop()
	if err := <-errc; err != nil {
		return result{}, err
	}
	return result{name: fmt.Sprintf("idemq runner, 1 UPDATE, batch %d", batch), n: b.opt.n, d: d}, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
