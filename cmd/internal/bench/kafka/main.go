// Command kafka measures, in one run against a real Kafka broker and a real
// PostgreSQL, idemq against a hand-written worker that does the same work:
//
//   - raw kafka-go: a consumer-group Reader that fetches with FetchMessage
//     and commits synchronously every 100 messages, with no handler and no
//     database (the ceiling);
//   - hand-written kafka-go + pgx workers (one goroutine per partition slot,
//     -concurrency of them, like the Runner's lanes): per message BEGIN; INSERT
//     INTO processed … ON CONFLICT DO NOTHING; UPDATE accounts …; COMMIT, then
//     the offset commit — synchronous CommitMessages (kafka-go's documented
//     explicit commit), or queued to kafka-go's 1 s commit loop (CommitInterval,
//     the faster variant); a batch variant: one transaction per up to 100
//     messages (an unnest INSERT … RETURNING and pipelined UPDATEs), then one
//     commit of the batch's offsets; and a batch-1 variant in the Runner's own
//     protocol, two round trips per message on a held connection (the claim
//     pipelined with the COMMIT AND CHAIN of the message before), the floor of
//     the Runner's batch-1 path;
//   - the idemq Runner over kafkasource with Transactional and pgdedup and
//     a one-UPDATE TxJSON handler, at the default config, at batch 1 and
//     at batch 100, and TransactionalBatch at batch 100.
//
// Every runner row and hand-written row also prints the client's CPU time
// and heap allocations per message (the whole process: the broker and the
// database run in other processes), and the ratios of the CPU times are
// printed with the ratios of the rates.
//
// With -rates (messages per second, comma-separated) it measures latency
// instead: for each rate, a fresh topic is produced to at that pace for
// -rate-for while the runner consumes it, at the default config, at batch 1
// and with the batch API at batch 100, and it prints the p50 and p99 of
// receipt-to-ack (Message.ReceivedAt to the end of the Ack call).
//
// Every run reads the same topic from its start with a fresh consumer group
// (and fresh deduplication keys), and the clock starts when its first
// message is fetched, so group joins are not counted. Every workload runs
// twice, in alternating order; ratios to the hand-written workers are printed
// per round and over the means.
//
//	go -C cmd/internal run ./bench/kafka
//
// TEST_KAFKA_BROKERS and TEST_DATABASE_URL select other servers.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/cmd/internal/bench/handwritten"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/kafkasource"
)

const schema = "idemq_bench_kafka"

type order struct {
	Account int   `json:"account"`
	Amount  int64 `json:"amount"`
}

func main() {
	var (
		brokers     = flag.String("brokers", envOr("TEST_KAFKA_BROKERS", "127.0.0.1:9092"), "comma-separated Kafka bootstrap brokers")
		dsn         = flag.String("dsn", "", "PostgreSQL URL (default: $TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable)")
		n           = flag.Int("n", 100000, "messages for the raw baseline and the batch-100 runs")
		n1          = flag.Int("n1", 20000, "messages for the batch-1 runs")
		rounds      = flag.Int("rounds", 2, "rounds of every workload, in alternating order")
		only        = flag.String("only", "", "run only the workloads whose name is, or else contains, one of these \"|\"-separated names")
		interval    = flag.Duration("commit-interval", 0, "kafkasource.Config.CommitInterval of the idemq runs (0: its default)")
		partitions  = flag.Int("partitions", 8, "partitions of the benchmark topic")
		concurrency = flag.Int("concurrency", 4, "Runner.Concurrency")
		accounts    = flag.Int("accounts", 1000, "rows in the accounts table")
		cpuprofile  = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
		memprofile  = flag.String("memprofile", "", "write an allocation profile of the whole run to this file")
		rates       = flag.String("rates", "", "latency mode: comma-separated produce rates in msg/s")
		rateFor     = flag.Duration("rate-for", 10*time.Second, "latency mode: how long each rate is produced")
	)
	flag.Parse()
	if *dsn == "" {
		*dsn = envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable")
	}
	stopProfile, err := handwritten.StartCPUProfile(*cpuprofile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	stopMem, err := handwritten.StartMemProfile(*memprofile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	b := &bench{
		brokers: strings.Split(*brokers, ","), dsn: *dsn, n: *n, n1: *n1,
		partitions: *partitions, concurrency: *concurrency, accounts: *accounts, rounds: *rounds, commitInterval: *interval, only: *only, rateFor: *rateFor,
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if *rates != "" {
		err = b.latency(ctx, *rates)
	} else {
		err = b.run(ctx)
	}
	cancel()
	stopProfile()
	stopMem()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type bench struct {
	brokers                        []string
	dsn                            string
	n, n1, partitions, concurrency int
	accounts, rounds               int
	commitInterval                 time.Duration
	only                           string
	rateFor                        time.Duration
	log                            *slog.Logger
	topic                          string
	pool                           *pgxpool.Pool
	store                          *pgdedup.Store
	suffix                         string
	handledTotal                   int64
}

func (b *bench) run(ctx context.Context) error {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	b.suffix = hex.EncodeToString(suffix)
	b.topic = "idemq-bench-" + b.suffix
	total := max(b.n, b.n1)

	if err := b.setupDatabase(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer b.pool.Close()
	defer b.pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)

	if err := kafkasource.CreateTopics(ctx, nil, b.brokers,
		kafkasource.TopicSpec{Name: b.topic, Partitions: b.partitions},
		kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(b.topic), Partitions: 1},
	); err != nil {
		return err
	}
	defer b.deleteTopics()
	t0 := time.Now()
	if err := b.produce(ctx, total); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	var fsync string
	_ = b.pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&fsync)
	fmt.Printf("Kafka source benchmark: topic %s, %d partitions, %d messages produced in %s; runner concurrency %d; PostgreSQL synchronous_commit=%s\n\n",
		b.topic, b.partitions, total, time.Since(t0).Round(time.Millisecond), b.concurrency, fsync)

	hb1, hb1a, hb100 := "batch 1 vs hand-written, sync offset commit", "batch 1 vs hand-written, 1 s offset commit loop", "batch 100 vs hand-written batch"
	hb1c := "batch 1 vs hand-written in the Runner's protocol (chained commits)"
	ws := []*handwritten.Workload{
		{Name: "raw kafka-go: FetchMessage, sync commit every 100", N: b.n, Run: func(ctx context.Context, round int) (time.Duration, error) {
			return b.raw(ctx, fmt.Sprintf("raw-100-%d", round), b.n, 100)
		}},
		{Name: "hand-written kafka-go+pgx, batch 1, sync commit", N: b.n1, Groups: []string{hb1}, Base: true, Run: func(ctx context.Context, round int) (time.Duration, error) {
			return b.hand(ctx, fmt.Sprintf("hand-1-sync-%d", round), b.n1, 1, 0, false)
		}},
		{Name: "hand-written kafka-go+pgx, batch 1, 1 s commit loop", N: b.n1, Groups: []string{hb1a}, Base: true, Run: func(ctx context.Context, round int) (time.Duration, error) {
			return b.hand(ctx, fmt.Sprintf("hand-1-async-%d", round), b.n1, 1, time.Second, false)
		}},
		{Name: "hand-written kafka-go+pgx, batch 1, chained commits", N: b.n1, Groups: []string{hb1c}, Base: true, Run: func(ctx context.Context, round int) (time.Duration, error) {
			return b.hand(ctx, fmt.Sprintf("hand-1-chain-%d", round), b.n1, 1, time.Second, true)
		}},
		{Name: "idemq Transactional+pgdedup, default config", N: b.n1, Groups: []string{hb1, hb1a}, Run: func(ctx context.Context, round int) (time.Duration, error) {
			return b.runnerRun(ctx, fmt.Sprintf("idemq-default-%d", round), b.n1, 0)
		}},
		{Name: "idemq Transactional+pgdedup, batch 1", N: b.n1, Groups: []string{hb1, hb1a, hb1c}, Run: func(ctx context.Context, round int) (time.Duration, error) {
			return b.runnerRun(ctx, fmt.Sprintf("idemq-1-%d", round), b.n1, 1)
		}},
		{Name: "hand-written kafka-go+pgx, batch 100, sync commit", N: b.n, Groups: []string{hb100}, Base: true, Run: func(ctx context.Context, round int) (time.Duration, error) {
			return b.hand(ctx, fmt.Sprintf("hand-100-%d", round), b.n, 100, 0, false)
		}},
		{Name: "idemq Transactional+pgdedup, batch 100", N: b.n, Groups: []string{hb100}, Run: func(ctx context.Context, round int) (time.Duration, error) {
			return b.runnerRun(ctx, fmt.Sprintf("idemq-100-%d", round), b.n, 100)
		}},
		{Name: "idemq TransactionalBatch (batch API)+pgdedup, batch 100", N: b.n, Groups: []string{hb100}, Run: func(ctx context.Context, round int) (time.Duration, error) {
			d, st, err := b.runner(ctx, fmt.Sprintf("idemq-api-%d", round), b.n, 100, b.pgBatchPath(), nil)
			b.handledTotal += int64(st.Handled)
			return d, err
		}},
	}
	ws = handwritten.Filter(ws, b.only)
	results, err := handwritten.Rounds(ctx, ws, b.rounds)
	if err != nil {
		return err
	}
	if err := b.checkBalances(ctx); err != nil {
		return err
	}
	handwritten.Report(ws, results, b.rounds)
	fmt.Println("\ntargets: batch 1 >= 1.0x, batch 100 >= 0.9x the hand-written worker")
	return nil
}

// runnerRun runs the idemq runner on the PostgreSQL path and counts its
// UPDATEs for the balance check.
func (b *bench) runnerRun(ctx context.Context, name string, n, batch int) (time.Duration, error) {
	d, st, err := b.runner(ctx, name, n, batch, b.pgPath(), nil)
	b.handledTotal += int64(st.Handled)
	return d, err
}

// hand runs the hand-written worker on n messages with a fresh group:
// -concurrency goroutines, each owning the partitions p with
// p % concurrency == its index, so a partition's messages are applied and
// committed in offset order. Each takes up to batch messages that are
// already fetched, applies them (one transaction per message at batch 1,
// one per batch otherwise) and then commits their offsets, synchronously
// when commitInterval is 0 and through kafka-go's commit loop otherwise.
// With chain (batch 1 only) the lanes apply messages in the Runner's own
// protocol (chainLane). The clock runs from the first fetch to the commit
// of the n-th message.
func (b *bench) hand(ctx context.Context, name string, n, batch int, commitInterval time.Duration, chain bool) (time.Duration, error) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: b.brokers, GroupID: "idemq-bench-" + name + "-" + b.suffix, Topic: b.topic,
		MaxWait: time.Second, HeartbeatInterval: time.Second, SessionTimeout: 10 * time.Second,
		CommitInterval: commitInterval,
	})
	defer r.Close()
	db := handwritten.DB{Pool: b.pool, Schema: schema}
	usage := handwritten.StartUsage()
	dbctx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lanes := make([]chan kafka.Message, b.concurrency)
	for i := range lanes {
		lanes[i] = make(chan kafka.Message, 1000)
	}
	var (
		first atomic.Int64
		t     = &tally{n: int64(n), end: make(chan time.Time, 1)}
		errc  = make(chan error, b.concurrency+1)
	)
	go func() {
		for {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				errc <- err
				return
			}
			first.CompareAndSwap(0, time.Now().UnixNano())
			select {
			case lanes[m.Partition%len(lanes)] <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, lane := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if chain {
				err = chainLane(ctx, dbctx, r, db, lane, name, t)
			} else {
				err = handLane(ctx, dbctx, r, db, lane, name, batch, t)
			}
			if err != nil && ctx.Err() == nil {
				errc <- err
			}
		}()
	}
	select {
	case end := <-t.end:
		cancel()
		wg.Wait()
		b.handledTotal += t.applied.Load()
		handwritten.NoteUsage(usage, n)
		return end.Sub(time.Unix(0, first.Load())), nil
	case err := <-errc:
		return 0, err
	}
}

// tally counts a hand-written run: the UPDATEs its transactions
// committed, and the messages whose offsets were committed, until n.
type tally struct {
	applied, done atomic.Int64
	n             int64
	end           chan time.Time // receives the time the n-th offset was committed
}

func (t *tally) committed(k int) { t.applied.Add(int64(k)) }

func (t *tally) acked(msgs int) {
	if t.done.Add(int64(msgs)) >= t.n {
		select {
		case t.end <- time.Now():
		default:
		}
	}
}

// handLane is one lane of the hand-written worker: it takes up to batch
// messages that are already fetched, applies them (one transaction per
// message at batch 1, one per batch otherwise) and commits their offsets.
// The transaction runs on dbctx, which is not cancelled with the run, so
// that the UPDATEs counted are exactly those committed.
func handLane(ctx, dbctx context.Context, r *kafka.Reader, db handwritten.DB, lane <-chan kafka.Message, name string, batch int, t *tally) error {
	msgs := make([]kafka.Message, 0, batch)
	decoded := make([]handwritten.Msg, 0, batch)
	for {
		msgs, decoded = msgs[:0], decoded[:0]
		select {
		case m := <-lane:
			msgs = append(msgs, m)
		case <-ctx.Done():
			return nil
		}
	drain:
		for len(msgs) < batch {
			select {
			case m := <-lane:
				msgs = append(msgs, m)
			default:
				break drain
			}
		}
		for _, m := range msgs {
			dm, err := decode(name, m)
			if err != nil {
				return err
			}
			decoded = append(decoded, dm)
		}
		var k int
		var err error
		if batch == 1 {
			k, err = db.One(dbctx, decoded[0])
		} else {
			k, err = db.Batch(dbctx, decoded)
		}
		if err != nil {
			return err
		}
		t.committed(k)
		if err := r.CommitMessages(ctx, msgs...); err != nil {
			return err
		}
		t.acked(len(msgs))
	}
}

// chainLane is one lane of the hand-written worker at batch 1 in the
// Runner's own protocol (handwritten.Chain): when the next message is
// already fetched, its claim goes with the commit of the one before.
func chainLane(ctx, dbctx context.Context, r *kafka.Reader, db handwritten.DB, lane <-chan kafka.Message, name string, t *tally) error {
	c, err := db.Chain(dbctx)
	if err != nil {
		return err
	}
	defer c.Release(dbctx)
	var (
		m     kafka.Message
		dm    handwritten.Msg
		taken bool // m is claimed in the open transaction
	)
	for {
		if !taken {
			select {
			case m = <-lane:
			case <-ctx.Done():
				return nil
			}
			if dm, err = decode(name, m); err != nil {
				return err
			}
			if err := c.Claim(dbctx, dm); err != nil {
				return err
			}
		}
		k, err := c.Apply(dbctx, dm)
		if err != nil {
			return err
		}
		done := m
		select {
		case m = <-lane:
			if dm, err = decode(name, m); err != nil {
				return err
			}
			err, taken = c.Claim(dbctx, dm), true // commits done
		default:
			err, taken = c.Commit(dbctx), false
		}
		if err != nil {
			return err
		}
		t.committed(k)
		if err := r.CommitMessages(ctx, done); err != nil {
			return err
		}
		t.acked(1)
	}
}

// decode reads m's key header and body; keys are prefixed with the run's
// name, so that every run's keys are fresh.
func decode(name string, m kafka.Message) (handwritten.Msg, error) {
	key := name + "/"
	for _, h := range m.Headers {
		if h.Key == kafkasource.DefaultKeyHeader {
			key += string(h.Value)
		}
	}
	return handwritten.Decode(key, m.Value)
}

func (b *bench) setupDatabase(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(b.concurrency + 2)
	if b.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	for _, sql := range []string{
		`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`,
		`CREATE SCHEMA ` + schema,
		`CREATE TABLE ` + schema + `.accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`,
		fmt.Sprintf(`INSERT INTO %s.accounts (id) SELECT generate_series(0, %d)`, schema, b.accounts-1),
	} {
		if _, err := b.pool.Exec(ctx, sql); err != nil {
			return err
		}
	}
	if err := (handwritten.DB{Pool: b.pool, Schema: schema}).Setup(ctx); err != nil {
		return err
	}
	if b.store, err = pgdedup.New(b.pool, pgdedup.Config{Schema: schema}); err != nil {
		return err
	}
	return b.store.Migrate(ctx)
}

func (b *bench) produce(ctx context.Context, total int) error {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(b.brokers...), Topic: b.topic, Transport: tr,
		Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchSize: 1000, BatchBytes: 4 << 20, BatchTimeout: 5 * time.Millisecond,
	}
	defer w.Close()
	const chunk = 5000
	msgs := make([]kafka.Message, 0, chunk)
	for i := 0; i < total; i++ {
		account := i % b.accounts
		msgs = append(msgs, kafka.Message{
			Key:     []byte("acct-" + strconv.Itoa(account)),
			Value:   []byte(`{"account":` + strconv.Itoa(account) + `,"amount":1}`),
			Headers: []kafka.Header{{Key: kafkasource.DefaultKeyHeader, Value: []byte("order-" + strconv.Itoa(i))}},
		})
		if len(msgs) == chunk || i == total-1 {
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				return err
			}
			msgs = msgs[:0]
		}
	}
	return nil
}

// raw consumes n messages with a plain kafka-go group reader and commits
// every commitEvery messages, synchronously. The clock starts at the first
// message.
func (b *bench) raw(ctx context.Context, name string, n, commitEvery int) (time.Duration, error) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: b.brokers, GroupID: "idemq-bench-" + name + "-" + b.suffix, Topic: b.topic,
		MaxWait: time.Second, HeartbeatInterval: time.Second, SessionTimeout: 10 * time.Second,
	})
	defer r.Close()
	var start time.Time
	pending := make([]kafka.Message, 0, commitEvery)
	for i := 0; i < n; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return 0, err
		}
		if i == 0 {
			start = time.Now()
		}
		pending = append(pending, m)
		if len(pending) == commitEvery || i == n-1 {
			if err := r.CommitMessages(ctx, pending...); err != nil {
				return 0, err
			}
			pending = pending[:0]
		}
	}
	return time.Since(start), nil
}

// firstFetch records when its source first returned messages.
type firstFetch struct {
	*kafkasource.Source
	at atomic.Int64
}

func (f *firstFetch) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	msgs, err := f.Source.Receive(ctx, max)
	if err == nil {
		f.at.CompareAndSwap(0, time.Now().UnixNano())
	}
	return msgs, err
}

// pgPath is the transactional path on PostgreSQL with a one-UPDATE handler.
func (b *bench) pgPath() consumer.Path {
	handler := func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, o order) error {
		_, err := tx.Exec(ctx, `UPDATE `+schema+`.accounts SET balance = balance + $1 WHERE id = $2`, o.Amount, o.Account)
		return err
	}
	return consumer.Transactional(b.store, consumer.TxJSON(handler))
}

// pgBatchPath is the transactional path with the batch API: the batch's
// UPDATEs go out pipelined in one round trip.
func (b *bench) pgBatchPath() consumer.Path {
	return consumer.TransactionalBatch(b.store, consumer.TxBatchJSON(func(ctx context.Context, tx pgx.Tx, items []consumer.BatchItem[order]) error {
		batch := &pgx.Batch{}
		for _, it := range items {
			batch.Queue(`UPDATE `+schema+`.accounts SET balance = balance + $1 WHERE id = $2`, it.Value.Amount, it.Value.Account)
		}
		return tx.SendBatch(ctx, batch).Close()
	}))
}

// runner runs the idemq runner until n messages were handled and
// acknowledged, and returns the time from the first fetch. batch 0 is the
// default config (BatchSize and the source's MaxInFlight at their
// defaults).
func (b *bench) runner(ctx context.Context, name string, n, batch int, path consumer.Path, hooks []consumer.Hook) (time.Duration, consumer.Stats, error) {
	return b.runnerOn(ctx, b.topic, name, n, batch, path, hooks, nil)
}

// runnerOn is runner on topic; started, when not nil, is called once the
// runner is running.
func (b *bench) runnerOn(ctx context.Context, topic, name string, n, batch int, path consumer.Path, hooks []consumer.Hook, started func(*consumer.Runner)) (time.Duration, consumer.Stats, error) {
	var none consumer.Stats
	usage := handwritten.StartUsage()
	group := "idemq-bench-" + name + "-" + b.suffix
	src, err := kafkasource.New(ctx, kafkasource.Config{
		Brokers: b.brokers, Topics: []string{topic}, GroupID: group,
		HeartbeatInterval: time.Second, SessionTimeout: 10 * time.Second,
		MaxInFlight:    max(kafkasource.Config{}.WithDefaults().MaxInFlight, 4*batch*b.concurrency),
		CommitInterval: b.commitInterval,
		Logger:         b.log,
	})
	if err != nil {
		return 0, none, err
	}
	defer src.Close()
	ff := &firstFetch{Source: src}
	r, err := consumer.NewRunner(ff, path, consumer.Config{
		Name: group, Concurrency: b.concurrency, BatchSize: batch, Logger: b.log, Hooks: hooks,
	})
	if err != nil {
		return 0, none, err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	if started != nil {
		started(r)
	}
	var end time.Time
	// A poll every 10 ms: the end is late by 0.1 % of a 10 s run at most,
	// and the runner's CPU is not charged for hundreds of wakeups a second.
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		st := r.Stats()
		if st.Handled+st.Duplicates >= uint64(n) {
			end = time.Now()
			break
		}
		select {
		case err := <-done:
			stop()
			return 0, none, fmt.Errorf("runner stopped early: %w", err)
		case <-ctx.Done():
			stop()
			return 0, none, ctx.Err()
		case <-poll.C:
		}
	}
	stop()
	if err := <-done; err != nil {
		return 0, none, err
	}
	st := r.Stats()
	if st.Duplicates != 0 || st.DeadLettered != 0 || st.CommitFailures != 0 {
		return 0, st, fmt.Errorf("unexpected runner stats %+v", st)
	}
	if started == nil {
		handwritten.NoteUsage(usage, n)
	}
	return end.Sub(time.Unix(0, ff.at.Load())), st, nil
}

// checkBalances verifies that every handled message applied its UPDATE once.
func (b *bench) checkBalances(ctx context.Context) error {
	var sum int64
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0) FROM `+schema+`.accounts`).Scan(&sum); err != nil {
		return err
	}
	if sum != b.handledTotal {
		return fmt.Errorf("accounts hold %d, but the runners handled %d messages (each adds 1)", sum, b.handledTotal)
	}
	return nil
}

func (b *bench) deleteTopics() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.DeleteTopics(ctx, nil, b.brokers, b.topic, kafkasource.DeadLetterTopic(b.topic)); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// latency runs, for each rate in rates, the runner configurations on a topic
// produced to at that rate, and prints receipt-to-ack percentiles.
func (b *bench) latency(ctx context.Context, rates string) error {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	b.suffix = hex.EncodeToString(suffix)
	if err := b.setupDatabase(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer b.pool.Close()
	defer b.pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	fmt.Printf("Kafka latency: %d partitions, runner concurrency %d; each row produces for %s at the rate\n", b.partitions, b.concurrency, b.rateFor)
	err := handwritten.LatencyTable(rates, b.rounds, func(rate, round int, c handwritten.LatencyConfig) (handwritten.Paced, error) {
		topic := fmt.Sprintf("idemq-bench-lat-%s-%d-%d-%d", b.suffix, rate, round, c.Batch)
		if err := kafkasource.CreateTopics(ctx, nil, b.brokers, kafkasource.TopicSpec{Name: topic, Partitions: b.partitions},
			kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(topic), Partitions: 1}); err != nil {
			return handwritten.Paced{}, err
		}
		defer b.deleteTopicsOf(topic)
		path := b.pgPath()
		if c.API {
			path = b.pgBatchPath()
		}
		return b.paced(ctx, topic, c.Batch, path, rate)
	})
	if err != nil {
		return err
	}
	return b.checkBalances(ctx)
}

// paced starts a runner on topic, warms it up and produces at rate for
// b.rateFor (handwritten.Pace), and waits until everything is handled.
func (b *bench) paced(ctx context.Context, topic string, batch int, path consumer.Path, rate int) (handwritten.Paced, error) {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(b.brokers...), Topic: topic, Transport: tr,
		Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, Async: true,
		BatchSize: 100, BatchTimeout: time.Millisecond,
	}
	defer w.Close()
	seq := 0
	msg := func() kafka.Message {
		account := seq % b.accounts
		seq++
		return kafka.Message{
			Key:   []byte("acct-" + strconv.Itoa(account)),
			Value: []byte(`{"account":` + strconv.Itoa(account) + `,"amount":1}`),
			Headers: []kafka.Header{
				{Key: kafkasource.DefaultKeyHeader, Value: []byte(topic + "-" + strconv.Itoa(seq))},
				{Key: handwritten.SentHeader, Value: []byte(strconv.FormatInt(time.Now().UnixNano(), 10))},
			},
		}
	}
	lat := new(handwritten.Latency)
	var (
		p    handwritten.Paced
		perr error
	)
	warm := 8 * b.partitions
	total := rate*int(b.rateFor/time.Millisecond)/1000 + warm
	_, st, err := b.runnerOn(ctx, topic, topic, total, batch, path, []consumer.Hook{lat}, func(r *consumer.Runner) {
		// The warm-up puts messages on every partition, handled (and a
		// second more) before the clock starts, so that every
		// partition's reader runs.
		p, perr = handwritten.Pace(ctx, r, lat, rate, warm, total, time.Second, func(_, n int) error {
			for range n {
				if err := w.WriteMessages(ctx, msg()); err != nil {
					return err
				}
			}
			return nil
		})
	})
	b.handledTotal += int64(st.Handled)
	if err == nil {
		err = perr
	}
	return p, err
}

func (b *bench) deleteTopicsOf(topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.DeleteTopics(ctx, nil, b.brokers, topic, kafkasource.DeadLetterTopic(topic)); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
	}
}
