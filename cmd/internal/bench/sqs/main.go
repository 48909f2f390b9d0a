// Command sqs measures the SQS source against a hand-written worker that
// does the same work, in one run on the same SQS server and PostgreSQL:
//
//   - raw: receive-and-delete with no handler and no database, the ceiling
//     of the queue (Receivers goroutines, each ReceiveMessage of 10 then
//     DeleteMessageBatch);
//   - hand-written SQS + pgx workers (-concurrency goroutines): each
//     receives 10 messages, applies each in its own transaction (BEGIN;
//     INSERT INTO processed … ON CONFLICT DO NOTHING; UPDATE accounts …;
//     COMMIT) and then deletes them with one DeleteMessageBatch; and a
//     batch variant that gathers up to 100 messages (up to 10 receives),
//     applies them in one transaction (an unnest INSERT … RETURNING and
//     pipelined UPDATEs) and then deletes them in batches of 10;
//   - idemq: a consumer.Runner over sqssource with Transactional, pgdedup
//     and a one-UPDATE TxJSON handler, at the default config (a lane takes
//     what is queued for it, up to 100, without waiting), at batch 1 and at
//     batch 100 (Config.BatchWait from -batch-wait, 50 ms), and the batch
//     API (TransactionalBatch) at batch 100.
//
// With -rates (messages per second, comma-separated) it measures latency
// instead: for each rate, a fresh queue is sent to at that pace for
// -rate-for (SendMessageBatch calls of up to 10 messages, each stamped with
// its send time) while the runner consumes it, at the default config, at
// batch 1 and with the batch API at batch 100 (BatchWait at its default, 0,
// as in the Kafka and RabbitMQ latency modes), and it prints the p50 and p99
// of receipt-to-ack (Message.ReceivedAt, when ReceiveMessage returned, to
// the end of the Ack call's DeleteMessageBatch) and of send-to-ack (which
// also counts the time a message waits in the queue for a long poll).
//
// Every runner and hand-written row also notes, below it, the client's CPU
// time and heap allocations per message (the whole process; ElasticMQ and
// PostgreSQL run in other processes). Every run drains its own queue, filled
// beforehand (the fill is not timed). Every workload runs twice, in
// alternating order; ratios to the hand-written workers are printed per
// round and over the means. Run it with
//
//	bash testdata/services/services.sh up postgres elasticmq
//	go -C cmd/internal run ./bench/sqs
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/cmd/internal/bench/handwritten"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/sqssource"
)

// waitTime is sqssource.Config.WaitTime of every runner: the long poll of
// one ReceiveMessage call.
const waitTime = time.Second

type options struct {
	endpoint, dsn string
	n, n1         int
	receivers     int
	concurrency   int
	accounts      int
	rounds        int
	only          string
	batchWait     time.Duration
	rates         string
	rateFor       time.Duration
}

func main() {
	var opt options
	flag.StringVar(&opt.endpoint, "endpoint", envOr("TEST_SQS_ENDPOINT", "http://127.0.0.1:9324"), "SQS endpoint")
	flag.StringVar(&opt.dsn, "dsn", "", "PostgreSQL URL (default: $TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable)")
	flag.IntVar(&opt.n, "n", 20000, "messages per run of the raw and batch-100 workloads")
	flag.IntVar(&opt.n1, "n1", 20000, "messages per run of the batch-1 workloads")
	flag.IntVar(&opt.receivers, "receivers", 4, "parallel receivers (raw) and sqssource.Config.MaxReceivers")
	flag.IntVar(&opt.concurrency, "concurrency", 4, "consumer.Config.Concurrency")
	flag.IntVar(&opt.accounts, "accounts", 1000, "rows in the accounts table")
	flag.IntVar(&opt.rounds, "rounds", 2, "rounds of every workload, in alternating order")
	flag.StringVar(&opt.only, "only", "", "run only the workloads whose name is, or else contains, one of these \"|\"-separated names")
	flag.DurationVar(&opt.batchWait, "batch-wait", 50*time.Millisecond, "consumer.Config.BatchWait of the batch-100 runners (throughput mode; the latency mode uses the default, 0)")
	flag.StringVar(&opt.rates, "rates", "", "latency mode: comma-separated send rates in msg/s")
	flag.DurationVar(&opt.rateFor, "rate-for", 10*time.Second, "latency mode: how long each rate is sent")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if opt.dsn == "" {
		opt.dsn = envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable")
	}
	stopProfile, err := handwritten.StartCPUProfile(*cpuprofile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	err = run(ctx, opt)
	cancel()
	stopProfile()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type bench struct {
	opt    options
	client *sqs.Client
	pool   *pgxpool.Pool
	store  *pgdedup.Store
	schema string
	queues []string
	// applied counts the UPDATEs of every run, for the balance check.
	applied atomic.Int64
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
	if opt.rates != "" {
		if err := b.latency(ctx); err != nil {
			return err
		}
		_, err := b.checkBalances(ctx)
		return err
	}

	fmt.Printf("SQS at %s, PostgreSQL, %d messages per run, %d receivers, runner concurrency %d, BatchWait %v at batch 100\n\n",
		opt.endpoint, opt.n, opt.receivers, opt.concurrency, opt.batchWait)
	b1, b100 := "batch 1 vs hand-written", "batch 100 vs hand-written batch"
	ws := []*handwritten.Workload{
		{Name: "raw receive+delete, no handler", N: opt.n, Run: func(ctx context.Context, _ int) (time.Duration, error) { return b.raw(ctx) }},
		{Name: "hand-written SQS+pgx, batch 1, DeleteMessageBatch", N: opt.n1, Groups: []string{b1}, Base: true, Run: func(ctx context.Context, round int) (time.Duration, error) {
			return b.hand(ctx, round, 1)
		}},
		{Name: "idemq Transactional+pgdedup, default config", N: opt.n, Groups: []string{b1}, Run: func(ctx context.Context, _ int) (time.Duration, error) {
			return b.idemq(ctx, 0, false)
		}},
		{Name: "idemq Transactional+pgdedup, batch 1", N: opt.n1, Groups: []string{b1}, Run: func(ctx context.Context, _ int) (time.Duration, error) {
			return b.idemq(ctx, 1, false)
		}},
		{Name: "hand-written SQS+pgx, batch 100", N: opt.n, Groups: []string{b100}, Base: true, Run: func(ctx context.Context, round int) (time.Duration, error) {
			return b.hand(ctx, round, 100)
		}},
		{Name: "idemq Transactional+pgdedup, batch 100", N: opt.n, Groups: []string{b100}, Run: func(ctx context.Context, _ int) (time.Duration, error) {
			return b.idemq(ctx, 100, false)
		}},
		{Name: "idemq TransactionalBatch (batch API)+pgdedup, batch 100", N: opt.n, Groups: []string{b100}, Run: func(ctx context.Context, _ int) (time.Duration, error) {
			return b.idemq(ctx, 100, true)
		}},
	}
	ws = handwritten.Filter(ws, opt.only)
	results, err := handwritten.Rounds(ctx, ws, opt.rounds)
	if err != nil {
		return err
	}
	total, err := b.checkBalances(ctx)
	if err != nil {
		return err
	}
	handwritten.Report(ws, results, opt.rounds)
	fmt.Printf("\neffects: sum of balances = %d = messages applied once each\n", total)
	fmt.Println("targets: >= 1.0x the hand-written worker at batch 1 and at batch 100")
	return nil
}

// checkBalances verifies that every message a run applied added its 1 once:
// the sum of the balances is b.applied. It returns that sum.
func (b *bench) checkBalances(ctx context.Context) (int64, error) {
	var total int64
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0) FROM `+pgx.Identifier{b.schema}.Sanitize()+`.accounts`).Scan(&total); err != nil {
		return 0, err
	}
	if total != b.applied.Load() {
		return total, fmt.Errorf("effects: sum of balances %d, want %d (each message applied once)", total, b.applied.Load())
	}
	return total, nil
}

// hand drains a queue with the hand-written worker: -concurrency
// goroutines, each gathering up to max(batch, 10) messages (receives of 10),
// applying them (a transaction per message at batch 1, one per gathering
// otherwise) and then deleting them with DeleteMessageBatch.
func (b *bench) hand(ctx context.Context, round, batch int) (time.Duration, error) {
	queueURL, _, err := b.filledQueue(ctx, fmt.Sprintf("hand-%d-%d", batch, round), b.nOf(batch))
	if err != nil {
		return 0, err
	}
	db := handwritten.DB{Pool: b.pool, Schema: pgx.Identifier{b.schema}.Sanitize()}
	var (
		done     atomic.Int64
		wg       sync.WaitGroup
		firstErr error
		once     sync.Once
	)
	var failed atomic.Bool
	fail := func(err error) {
		once.Do(func() { firstErr = err })
		failed.Store(true)
	}
	usage := handwritten.StartUsage()
	start := time.Now()
	for range b.opt.concurrency {
		wg.Go(func() {
			for done.Load() < int64(b.nOf(batch)) && !failed.Load() {
				// At batch 1 a careful worker still receives 10 per call
				// and deletes them in one call; it commits each alone.
				want := max(batch, 10)
				var got []types.Message
				for len(got) < want {
					wait := int32(1)
					if len(got) > 0 {
						wait = 0 // gather what is there, do not wait for more
					}
					out, err := b.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
						QueueUrl: aws.String(queueURL), MaxNumberOfMessages: int32(min(10, want-len(got))), WaitTimeSeconds: wait, VisibilityTimeout: 30,
					})
					if err != nil {
						fail(err)
						return
					}
					got = append(got, out.Messages...)
					if len(out.Messages) == 0 || batch == 1 {
						break
					}
				}
				if len(got) == 0 {
					continue
				}
				ms := make([]handwritten.Msg, len(got))
				for i, m := range got {
					if ms[i], err = handwritten.Decode(aws.ToString(m.MessageId), []byte(aws.ToString(m.Body))); err != nil {
						fail(err)
						return
					}
				}
				if batch == 1 {
					for _, m := range ms {
						k, err := db.One(ctx, m)
						if err != nil {
							fail(err)
							return
						}
						b.applied.Add(int64(k))
					}
				} else {
					k, err := db.Batch(ctx, ms)
					if err != nil {
						fail(err)
						return
					}
					b.applied.Add(int64(k))
				}
				for i := 0; i < len(got); i += 10 {
					chunk := got[i:min(i+10, len(got))]
					entries := make([]types.DeleteMessageBatchRequestEntry, len(chunk))
					for j, m := range chunk {
						entries[j] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), ReceiptHandle: m.ReceiptHandle}
					}
					del, err := b.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
					if err != nil {
						fail(err)
						return
					}
					done.Add(int64(len(del.Successful)))
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	handwritten.NoteUsage(usage, b.nOf(batch))
	return d, firstErr
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
	if err := (handwritten.DB{Pool: b.pool, Schema: ident}).Setup(ctx); err != nil {
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
	Account int   `json:"account"`
	Amount  int64 `json:"amount"`
}

// filledQueue creates a queue (and its dead-letter queue) holding n messages.
func (b *bench) filledQueue(ctx context.Context, name string, n int) (queueURL, dlqURL string, err error) {
	if queueURL, dlqURL, err = b.newQueue(ctx, name); err != nil {
		return "", "", err
	}
	return queueURL, dlqURL, b.sendRange(ctx, queueURL, 0, n, false)
}

// newQueue creates an empty queue and its dead-letter queue, both deleted by
// cleanup unless deleteQueues deleted them first.
func (b *bench) newQueue(ctx context.Context, name string) (queueURL, dlqURL string, err error) {
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
	return queueURL, dlqURL, nil
}

// deleteQueues deletes queues that newQueue created, at once rather than at
// cleanup.
func (b *bench) deleteQueues(ctx context.Context, urls ...string) error {
	var errs []error
	for _, u := range urls {
		b.queues = slices.DeleteFunc(b.queues, func(q string) bool { return q == u })
		if _, err := b.client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(u)}); err != nil {
			errs = append(errs, fmt.Errorf("delete queue %s: %w", u, err))
		}
	}
	return errors.Join(errs...)
}

// sendRange sends messages from to from+n-1 to queueURL, in
// SendMessageBatch calls of up to 10 messages, up to 8 calls at a time.
// Message i adds 1 to account i % -accounts. With stamp, each message
// carries the time its batch was sent in the handwritten.SentHeader string
// attribute (Unix nanoseconds), which sqssource hands on in
// consumer.Message.Headers.
func (b *bench) sendRange(ctx context.Context, queueURL string, from, n int, stamp bool) error {
	var (
		wg       sync.WaitGroup
		next     atomic.Int64
		firstErr error
		once     sync.Once
	)
	next.Store(int64(from))
	end := from + n
	for range min(8, (n+9)/10) {
		wg.Go(func() {
			for {
				start := int(next.Add(10)) - 10
				if start >= end {
					return
				}
				var attrs map[string]types.MessageAttributeValue
				if stamp {
					attrs = map[string]types.MessageAttributeValue{handwritten.SentHeader: {
						DataType: aws.String("String"), StringValue: aws.String(strconv.FormatInt(time.Now().UnixNano(), 10)),
					}}
				}
				var entries []types.SendMessageBatchRequestEntry
				for i := start; i < min(start+10, end); i++ {
					body, _ := json.Marshal(order{Account: i % b.opt.accounts, Amount: 1})
					entries = append(entries, types.SendMessageBatchRequestEntry{
						Id: aws.String(strconv.Itoa(i - start)), MessageBody: aws.String(string(body)), MessageAttributes: attrs,
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
	return firstErr
}

// raw receives and deletes every message with no handler.
func (b *bench) raw(ctx context.Context) (time.Duration, error) {
	queueURL, _, err := b.filledQueue(ctx, "raw", b.opt.n)
	if err != nil {
		return 0, err
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
	return time.Since(start), firstErr
}

// idemq drains a queue through a Runner whose handler updates one row, at
// Config.BatchSize batch (0: the default config).
func (b *bench) idemq(ctx context.Context, batch int, api bool) (time.Duration, error) {
	queueURL, dlqURL, err := b.filledQueue(ctx, fmt.Sprintf("idemq-%d", batch), b.nOf(batch))
	if err != nil {
		return 0, err
	}
	cfg := consumer.Config{BatchSize: batch}
	if batch > 1 {
		// SQS hands out at most 10 messages per receive, spread over the
		// lanes: a lane waits for its batch to fill, as the hand-written
		// worker gathers 100 before its transaction.
		cfg.BatchWait = b.opt.batchWait
	}
	return b.runner(ctx, queueURL, dlqURL, b.nOf(batch), cfg, api, nil)
}

// runner runs a Runner over sqssource on queueURL, whose handler updates one
// row (TransactionalBatch when api), until n messages are deleted, and adds
// the messages it handled to b.applied. cfg gives BatchSize, BatchWait and
// Hooks; the rest is set here. It returns the time from the start of Run to
// the n-th delete, or, when started is not nil, from when started returned
// (started is called once the runner runs, and its error stops the run).
func (b *bench) runner(ctx context.Context, queueURL, dlqURL string, n int, cfg consumer.Config, api bool, started func(*consumer.Runner) error) (time.Duration, error) {
	batch := cfg.BatchSize
	src, err := sqssource.New(ctx, b.client, sqssource.Config{
		QueueURL:           queueURL,
		DeadLetterQueueURL: dlqURL,
		MaxReceivers:       b.opt.receivers,
		WaitTime:           waitTime,
	})
	if err != nil {
		return 0, err
	}
	defer src.Close()
	update := fmt.Sprintf(`UPDATE %s.accounts SET balance = balance + $1 WHERE id = $2`, pgx.Identifier{b.schema}.Sanitize())
	handler := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, o order) error {
		_, err := tx.Exec(ctx, update, o.Amount, o.Account)
		return err
	})
	path := consumer.Transactional(b.store, handler)
	if api {
		path = consumer.TransactionalBatch(b.store, consumer.TxBatchJSON(func(ctx context.Context, tx pgx.Tx, items []consumer.BatchItem[order]) error {
			batch := &pgx.Batch{}
			for _, it := range items {
				batch.Queue(update, it.Value.Amount, it.Value.Account)
			}
			return tx.SendBatch(ctx, batch).Close()
		}))
	}
	cfg.Name = fmt.Sprintf("bench-%d-%s", batch, rand.Text()[:6])
	cfg.Concurrency = b.opt.concurrency
	sizes := new(batchSizes)
	cfg.Hooks = append(slices.Clip(cfg.Hooks), sizes)
	r, err := consumer.NewRunner(src, path, cfg)
	if err != nil {
		return 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	usage := handwritten.StartUsage()
	start := time.Now()
	go func() { errc <- r.Run(runCtx) }()
	if started != nil {
		if err := started(r); err != nil {
			stop()
			if runErr := <-errc; runErr != nil && !errors.Is(runErr, context.Canceled) {
				err = errors.Join(err, runErr)
			}
			b.applied.Add(int64(r.Stats().Handled))
			return 0, err
		}
		start = time.Now()
	}
	for {
		st := r.Stats()
		if src.Stats().Deleted >= uint64(n) {
			break
		}
		if st.DeadLettered > 0 || st.CommitFailures > 0 {
			return 0, fmt.Errorf("runner stats %+v", st)
		}
		select {
		case err := <-errc:
			return 0, errors.Join(errors.New("runner stopped early"), err)
		case <-ctx.Done():
			return 0, fmt.Errorf("timed out: %+v", r.Stats())
		case <-time.After(5 * time.Millisecond):
		}
	}
	d := time.Since(start)
	stop()
	if err := <-errc; err != nil {
		return 0, err
	}
	b.applied.Add(int64(r.Stats().Handled))
	if started == nil {
		handwritten.NoteUsage(usage, n)
	}
	if txs := sizes.batches.Load(); txs > 0 && started == nil {
		kind := "per-message handler"
		if api {
			kind = "batch API"
		}
		handwritten.Note("idemq batch %d, %s, BatchWait %v: %d transactions, %.1f messages each",
			batch, kind, cfg.BatchWait, txs, float64(sizes.messages.Load())/float64(txs))
	}
	return d, nil
}

// batchSizes counts a Runner's batches and their messages.
type batchSizes struct{ batches, messages atomic.Int64 }

// OnBatch implements consumer.HookBatch.
func (s *batchSizes) OnBatch(_ context.Context, size int) {
	s.batches.Add(1)
	s.messages.Add(int64(size))
}

// nOf is the message count of a run at batch.
func (b *bench) nOf(batch int) int {
	if batch == 1 {
		return b.opt.n1
	}
	return b.opt.n
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// latency runs, for each rate in -rates, the runner configurations on a
// fresh queue sent to at that rate, and prints receipt-to-ack and
// send-to-ack percentiles.
func (b *bench) latency(ctx context.Context) error {
	fmt.Printf("SQS latency at %s: %d receivers (WaitTime %v), runner concurrency %d; each row sends for %s at the rate\n",
		b.opt.endpoint, b.opt.receivers, waitTime, b.opt.concurrency, b.opt.rateFor)
	return handwritten.LatencyTable(b.opt.rates, b.opt.rounds, func(rate, round int, c handwritten.LatencyConfig) (handwritten.Paced, error) {
		return b.paced(ctx, fmt.Sprintf("lat-%d-%d-%d", rate, c.Batch, round), c.Batch, c.API, rate)
	})
}

// paced creates a fresh queue, starts a runner on it and paces it
// (handwritten.Pace: SendMessageBatch calls of up to 10 messages), waits
// until every message is deleted, and deletes the queue.
func (b *bench) paced(ctx context.Context, name string, batch int, api bool, rate int) (p handwritten.Paced, err error) {
	queueURL, dlqURL, err := b.newQueue(ctx, name)
	if err != nil {
		return p, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		err = errors.Join(err, b.deleteQueues(dctx, queueURL, dlqURL))
	}()
	// A run that loses messages fails instead of waiting for the
	// benchmark's 30 minutes.
	ctx, cancel := context.WithTimeout(ctx, b.opt.rateFor+2*time.Minute)
	defer cancel()
	const warm = 20
	total := rate*int(b.opt.rateFor/time.Millisecond)/1000 + warm
	lat := new(handwritten.Latency)
	cfg := consumer.Config{BatchSize: batch, Hooks: []consumer.Hook{lat}}
	_, err = b.runner(ctx, queueURL, dlqURL, total, cfg, api, func(r *consumer.Runner) error {
		var err error
		p, err = handwritten.Pace(ctx, r, lat, rate, warm, total, 0, func(from, n int) error {
			return b.sendRange(ctx, queueURL, from, n, true)
		})
		return err
	})
	return p, err
}
