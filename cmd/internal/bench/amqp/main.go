// Command amqp measures the RabbitMQ source against a hand-written worker
// that does the same work, in one run on the same broker and database:
//
//   - raw: an amqp091-go consumer with one multiple-ack per 100 deliveries,
//     no handler and no database (the ceiling);
//   - hand-written amqp091 + pgx workers (-concurrency goroutines on one
//     channel, prefetch as the Runner's): per delivery BEGIN; INSERT INTO
//     processed … ON CONFLICT DO NOTHING; UPDATE accounts …; COMMIT, then
//     basic.ack; and a batch variant: one transaction per up to 100
//     deliveries (an unnest INSERT … RETURNING and pipelined UPDATEs), then
//     their acks;
//   - the idemq Runner with Transactional, pgdedup and a one-UPDATE TxJSON
//     handler at the default config (BatchSize and the source's Prefetch
//     at their defaults), at batch 1 and at batch 100, and
//     TransactionalBatch at batch 100.
//
// Every runner row and hand-written row also prints the client's CPU time
// and heap allocations per message.
//
// With -rates (messages per second, comma-separated) it measures latency
// instead: for each rate, a fresh queue is published to at that pace for
// -rate-for while the runner consumes it, at the default config, at batch 1
// and with the batch API at batch 100, and it prints the p50 and p99 of
// receipt-to-ack (Message.ReceivedAt to the end of the Ack call).
//
// Each run consumes its own pre-filled durable queue; publishing is not
// timed. Every workload runs twice, in alternating order; ratios to the
// hand-written workers are printed per round and over the means. Run it with
//
//	go -C cmd/internal run ./bench/amqp
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/cmd/internal/bench/handwritten"
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
	rounds                int
	only, cpuprofile      string
	quorum                bool
	ackHold               time.Duration
	rates                 string
	rateFor               time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.amqpURL, "amqp", "", "RabbitMQ URL (default: $TEST_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/)")
	flag.StringVar(&o.dsn, "dsn", "", "PostgreSQL URL (default: $TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable)")
	flag.IntVar(&o.rawN, "raw", 50000, "messages for the raw consumer")
	flag.IntVar(&o.b1N, "n1", 20000, "messages for the batch-1 runs")
	flag.IntVar(&o.b100N, "n100", 100000, "messages for the batch-100 runs (at least 5 s each)")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds of every workload, in alternating order")
	flag.StringVar(&o.only, "only", "", "run only the workloads whose name is, or else contains, one of these \"|\"-separated names")
	flag.IntVar(&o.concurrency, "concurrency", 4, "Runner.Concurrency")
	flag.IntVar(&o.accounts, "accounts", 1000, "rows in the accounts table")
	flag.BoolVar(&o.quorum, "quorum", false, "use quorum queues instead of classic queues")
	flag.DurationVar(&o.ackHold, "ack-hold", 0, "amqpsource.Config.AckHold of the idemq runs (0: its default; negative: no hold)")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.StringVar(&o.rates, "rates", "", "latency mode: comma-separated publish rates in msg/s")
	flag.DurationVar(&o.rateFor, "rate-for", 10*time.Second, "latency mode: how long each rate is published")
	flag.Parse()
	if o.amqpURL == "" {
		o.amqpURL = envOr("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	}
	if o.dsn == "" {
		o.dsn = envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable")
	}
	stopProfile, err := handwritten.StartCPUProfile(o.cpuprofile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	err = run(ctx, o)
	cancel()
	stopProfile()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	pool, store, err := setupDatabase(ctx, o)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) // best effort
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
	hold := amqpsource.Config{AckHold: o.ackHold}.WithDefaults().AckHold
	fmt.Printf("RabbitMQ source benchmark: %s queues, persistent messages, Runner concurrency %d, AckHold %v, %d accounts, synchronous_commit=%s\n\n",
		queueType, o.concurrency, hold, o.accounts, fsync)

	var queues []string
	defer func() {
		if ch, err := conn.Channel(); err == nil {
			for _, q := range queues {
				for _, name := range amqpsource.QueueNames(amqpsource.Config{Queue: q}) {
					_, _ = ch.QueueDelete(name, false, false, false)
				}
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

	var applied int64 // UPDATEs of every run, for the balance check
	if o.rates != "" {
		applied, err = latency(ctx, o, conn, store, func(name string) (string, error) {
			q := "idemq.bench." + name + "." + randHex()
			queues = append(queues, q)
			return q, declare(ctx, o, q, queueType)
		})
		if err != nil {
			return err
		}
		var total int64
		if err := pool.QueryRow(ctx, `SELECT sum(balance) FROM `+schema+`.accounts`).Scan(&total); err != nil {
			return err
		}
		if total != applied {
			return fmt.Errorf("effects: sum of balances %d, want %d (each message applied once)", total, applied)
		}
		return nil
	}
	hand := func(batch int) func(ctx context.Context, round int) (time.Duration, error) {
		return func(ctx context.Context, round int) (time.Duration, error) {
			q, err := fill(fmt.Sprintf("hand%d-%d", batch, round), nOf(o, batch))
			if err != nil {
				return 0, err
			}
			d, k, err := handWorker(ctx, conn, pool, q, nOf(o, batch), batch, o.concurrency)
			applied += k
			return d, err
		}
	}
	idemq := func(batch int, api bool) func(ctx context.Context, round int) (time.Duration, error) {
		return func(ctx context.Context, round int) (time.Duration, error) {
			q, err := fill(fmt.Sprintf("idemq%d-%d", batch, round), nOf(o, batch))
			if err != nil {
				return 0, err
			}
			d, k, err := runner(ctx, o, q, store, nOf(o, batch), batch, api, nil, nil)
			applied += k
			return d, err
		}
	}
	prefetch100 := amqpsource.PrefetchFor(consumer.Config{Concurrency: o.concurrency, BatchSize: 100})
	b1, b100 := "batch 1 vs hand-written", "batch 100 vs hand-written batch"
	ws := []*handwritten.Workload{
		{Name: "raw amqp091 consume + multiple-ack / 100", N: o.rawN, Run: func(ctx context.Context, round int) (time.Duration, error) {
			q, err := fill(fmt.Sprintf("raw-%d", round), o.rawN)
			if err != nil {
				return 0, err
			}
			return raw(ctx, conn, q, o.rawN, prefetch100, 100)
		}},
		{Name: "hand-written amqp091+pgx, batch 1", N: o.b1N, Groups: []string{b1}, Base: true, Run: hand(1)},
		{Name: "idemq Transactional+pgdedup, default config", N: o.b1N, Groups: []string{b1}, Run: idemq(0, false)},
		{Name: "idemq Transactional+pgdedup, batch 1", N: o.b1N, Groups: []string{b1}, Run: idemq(1, false)},
		{Name: "hand-written amqp091+pgx, batch 100", N: o.b100N, Groups: []string{b100}, Base: true, Run: hand(100)},
		{Name: "idemq Transactional+pgdedup, batch 100", N: o.b100N, Groups: []string{b100}, Run: idemq(100, false)},
		{Name: "idemq TransactionalBatch (batch API)+pgdedup, batch 100", N: o.b100N, Groups: []string{b100}, Run: idemq(100, true)},
	}
	ws = handwritten.Filter(ws, o.only)
	results, err := handwritten.Rounds(ctx, ws, o.rounds)
	if err != nil {
		return err
	}

	var total int64
	if err := pool.QueryRow(ctx, `SELECT sum(balance) FROM `+schema+`.accounts`).Scan(&total); err != nil {
		return err
	}
	if total != applied {
		return fmt.Errorf("effects: sum of balances %d, want %d (each message applied once)", total, applied)
	}
	handwritten.Report(ws, results, o.rounds)
	fmt.Printf("\neffects: sum of balances = %d = messages applied once each\n", total)
	fmt.Println("targets: >= 1.0x the hand-written worker at batch 1 and at batch 100")
	return nil
}

// nOf is the message count of a run at batch (0: the default config).
func nOf(o options, batch int) int {
	if batch <= 1 {
		return o.b1N
	}
	return o.b100N
}

// handWorker is the hand-written worker: a dispatcher hands one channel's
// deliveries to concurrency goroutines by their account header (as the
// Runner's lanes do with PartitionKeyHeader, so that concurrent
// transactions do not wait on each other's row locks); each takes up to
// batch deliveries that have arrived,
// applies them (one transaction per delivery at batch 1, one per batch
// otherwise), and then acknowledges them one by one. It returns when n
// deliveries are acknowledged, with the number of UPDATEs applied.
func handWorker(ctx context.Context, conn *amqp.Connection, pool *pgxpool.Pool, q string, n, batch, concurrency int) (time.Duration, int64, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, 0, err
	}
	defer ch.Close()
	if err := ch.Qos(amqpsource.PrefetchFor(consumer.Config{Concurrency: concurrency, BatchSize: batch}), 0, false); err != nil {
		return 0, 0, err
	}
	db := handwritten.DB{Pool: pool, Schema: schema}
	usage := handwritten.StartUsage()
	defer handwritten.NoteUsage(usage, n)
	start := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Not ConsumeWithContext: it sends basic.cancel from a goroutine of its
	// own when runCtx ends, concurrently with the deferred Close. A round-2
	// run hung in that Close (waiting for its close-ok) after the worker
	// had consumed every message; Close alone cancels the consumer.
	deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		return 0, 0, err
	}
	var (
		done, applied atomic.Int64
		end           = make(chan time.Time, 1)
		errc          = make(chan error, concurrency+1)
		wg            sync.WaitGroup
	)
	lanes := make([]chan amqp.Delivery, concurrency)
	for i := range lanes {
		lanes[i] = make(chan amqp.Delivery, 2*batch)
	}
	go func() {
		for {
			select {
			case d, ok := <-deliveries:
				if !ok {
					errc <- errors.New("delivery channel closed (connection lost)")
					return
				}
				acct, _ := strconv.Atoi(fmt.Sprint(d.Headers["account"]))
				select {
				case lanes[acct%concurrency] <- d:
				case <-runCtx.Done():
					return
				}
			case <-runCtx.Done():
				return
			}
		}
	}()
	for _, deliveries := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ds := make([]amqp.Delivery, 0, batch)
			ms := make([]handwritten.Msg, 0, batch)
			for {
				ds, ms = ds[:0], ms[:0]
				select {
				case d, ok := <-deliveries:
					if !ok {
						return
					}
					ds = append(ds, d)
				case <-runCtx.Done():
					return
				}
			drain:
				for len(ds) < batch {
					select {
					case d, ok := <-deliveries:
						if !ok {
							break drain
						}
						ds = append(ds, d)
					default:
						break drain
					}
				}
				for _, d := range ds {
					key, _ := d.Headers[amqpsource.DefaultKeyHeader].(string)
					m, err := handwritten.Decode(key, d.Body)
					if err != nil {
						errc <- err
						return
					}
					ms = append(ms, m)
				}
				var k int
				if batch == 1 {
					k, err = db.One(ctx, ms[0])
				} else {
					k, err = db.Batch(ctx, ms)
				}
				if err != nil {
					errc <- err
					return
				}
				applied.Add(int64(k))
				for _, d := range ds {
					if err := d.Ack(false); err != nil {
						errc <- err
						return
					}
				}
				if done.Add(int64(len(ds))) >= int64(n) {
					select {
					case end <- time.Now():
					default:
					}
				}
			}
		}()
	}
	select {
	case t := <-end:
		cancel()
		wg.Wait()
		return t.Sub(start), applied.Load(), nil
	case err := <-errc:
		cancel()
		wg.Wait()
		return 0, applied.Load(), err
	}
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
	if err == nil {
		err = handwritten.DB{Pool: pool, Schema: schema}.Setup(ctx)
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
	ch, err := confirmChannel(conn)
	if err != nil {
		return err
	}
	defer ch.Close()
	return publishFrom(ctx, ch, q, 0, n, accounts)
}

// confirmChannel opens a channel on conn in confirm mode.
func confirmChannel(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	return ch, nil
}

// publishFrom publishes messages from to from+n-1 of q on ch, a channel in
// confirm mode, and waits for their confirms.
func publishFrom(ctx context.Context, ch *amqp.Channel, q string, from, n, accounts int) error {
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
	for i := from; i < from+n; i++ {
		acct := i % accounts
		body, _ := json.Marshal(order{Account: acct, Amount: 1})
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{
			Headers: amqp.Table{
				amqpsource.DefaultKeyHeader: q + "-" + strconv.Itoa(i),
				"account":                   strconv.Itoa(acct),
				handwritten.SentHeader:      strconv.FormatInt(time.Now().UnixNano(), 10),
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

// runner runs the idemq Runner with the one-UPDATE handler over q until n
// messages are handled, and returns the number it handled. batch 0 is the
// default config (BatchSize and Prefetch at their defaults). started, when
// not nil, is called once the runner runs; the clock starts after it.
func runner(ctx context.Context, o options, q string, store *pgdedup.Store, n, batch int, api bool, hooks []consumer.Hook, started func(*consumer.Runner) error) (time.Duration, int64, error) {
	rc := consumer.Config{
		Name: "bench-amqp", Concurrency: o.concurrency, BatchSize: batch, Hooks: hooks,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	prefetch := amqpsource.PrefetchFor(rc)
	if batch == 0 {
		prefetch = 0
	}
	usage := handwritten.StartUsage()
	start := time.Now()
	src, err := amqpsource.New(ctx, amqpsource.Config{
		URL: o.amqpURL, Queue: q, Prefetch: prefetch, AckHold: o.ackHold,
		PartitionKeyHeader: "account", // batches never lock accounts in crossing orders
	})
	if err != nil {
		return 0, 0, err
	}
	defer src.Close()
	handler := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, v order) error {
		_, err := tx.Exec(ctx, `UPDATE `+schema+`.accounts SET balance = balance + $1 WHERE id = $2`, v.Amount, v.Account)
		return err
	})
	path := consumer.Transactional(store, handler)
	if api {
		path = consumer.TransactionalBatch(store, consumer.TxBatchJSON(func(ctx context.Context, tx pgx.Tx, items []consumer.BatchItem[order]) error {
			batch := &pgx.Batch{}
			for _, it := range items {
				batch.Queue(`UPDATE `+schema+`.accounts SET balance = balance + $1 WHERE id = $2`, it.Value.Amount, it.Value.Account)
			}
			return tx.SendBatch(ctx, batch).Close()
		}))
	}
	r, err := consumer.NewRunner(src, path, rc)
	if err != nil {
		return 0, 0, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	if started != nil {
		if err := started(r); err != nil {
			cancel()
			if runErr := <-done; runErr != nil && !errors.Is(runErr, context.Canceled) {
				err = errors.Join(err, runErr)
			}
			return 0, int64(r.Stats().Handled), err
		}
		start = time.Now()
	}
	// A poll every 10 ms: the end is late by 0.1 % of a 10 s run at most,
	// and the runner's CPU is not charged for hundreds of wakeups a second.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for r.Stats().Handled < uint64(n) {
		select {
		case <-tick.C:
		case err := <-done:
			cancel()
			return 0, 0, fmt.Errorf("runner stopped early: %w", err)
		}
	}
	d := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		return 0, 0, err
	}
	if s := r.Stats(); s.Retried+s.DeadLettered+s.Duplicates > 0 {
		return 0, 0, fmt.Errorf("unexpected: %+v", s)
	}
	if started == nil {
		handwritten.NoteUsage(usage, n)
	}
	if st := src.Stats(); st.AckFrames > 0 && started == nil {
		handwritten.Note("idemq batch %d: %d acknowledged in %d basic.ack frames (%.1f per frame)",
			batch, st.Acked, st.AckFrames, float64(st.Acked)/float64(st.AckFrames))
	}
	return d, int64(r.Stats().Handled), nil
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

// latency runs, for each rate in o.rates, the runner configurations on a
// queue published to at that rate, and prints receipt-to-ack percentiles.
func latency(ctx context.Context, o options, conn *amqp.Connection, store *pgdedup.Store, fresh func(name string) (string, error)) (int64, error) {
	fmt.Printf("RabbitMQ latency: runner concurrency %d; each row publishes for %s at the rate\n", o.concurrency, o.rateFor)
	var applied int64
	err := handwritten.LatencyTable(o.rates, o.rounds, func(rate, round int, c handwritten.LatencyConfig) (p handwritten.Paced, err error) {
		q, err := fresh(fmt.Sprintf("lat%d-%d-%d", rate, c.Batch, round))
		if err != nil {
			return p, err
		}
		const warm = 20
		total := rate*int(o.rateFor/time.Millisecond)/1000 + warm
		lat := new(handwritten.Latency)
		_, k, err := runner(ctx, o, q, store, total, c.Batch, c.API, []consumer.Hook{lat}, func(r *consumer.Runner) error {
			ch, err := confirmChannel(conn)
			if err != nil {
				return err
			}
			defer ch.Close()
			p, err = handwritten.Pace(ctx, r, lat, rate, warm, total, 0, func(from, n int) error {
				return publishFrom(ctx, ch, q, from, n, o.accounts)
			})
			return err
		})
		applied += k
		return p, err
	})
	return applied, err
}
