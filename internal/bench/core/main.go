// Command core measures the transactional path on a real PostgreSQL and prints
// one table, all workloads in one run against the same database with the
// same business mutation (one UPDATE of an accounts row per message):
//
//   - the naive worker of the reference texts: per message BEGIN; check;
//     INSERT record; UPDATE; COMMIT;
//   - the idemq runner at batch size 1 and at batch size 100;
//   - the idemq runner at batch size 100 without the dedup record (same
//     pipeline, a store that records nothing), which gives the cost of the
//     record per message;
//   - the idemq runner at batch size 100 re-reading the same messages, all
//     duplicates.
//
// The messages come from an in-process source (no broker), so the numbers
// are those of the database path. Run it with `make bench`, which starts
// PostgreSQL; TEST_DATABASE_URL selects another server.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
)

const schema = "idemq_bench"

type order struct {
	Account int   `json:"account"`
	Amount  int64 `json:"amount"`
}

func main() {
	var (
		dsn         = flag.String("dsn", envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable"), "PostgreSQL URL")
		naiveN      = flag.Int("naive", 3000, "messages for the naive worker and batch size 1")
		batchN      = flag.Int("n", 20000, "messages for the batched runs")
		concurrency = flag.Int("concurrency", 4, "workers (naive) and Runner.Concurrency (idemq)")
		accounts    = flag.Int("accounts", 1000, "rows in the accounts table")
		cpuprofile  = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	)
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := run(ctx, *dsn, *naiveN, *batchN, *concurrency, *accounts); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1) //nolint:gocritic // the profile is flushed above
	}
}

type result struct {
	name string
	n    int
	d    time.Duration
}

func (r result) rate() float64 { return float64(r.n) / r.d.Seconds() }

func run(ctx context.Context, dsn string, naiveN, batchN, concurrency, accounts int) error {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(concurrency + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	setup := []string{
		`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`,
		`CREATE SCHEMA ` + schema,
		`CREATE TABLE ` + schema + `.accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`,
		fmt.Sprintf(`INSERT INTO %s.accounts (id) SELECT generate_series(0, %d)`, schema, accounts-1),
	}
	for _, sql := range setup {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	defer pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) //nolint:errcheck
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}

	var fsync string
	_ = pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&fsync)
	fmt.Printf("PostgreSQL path benchmark: concurrency %d, %d accounts, synchronous_commit=%s\n\n", concurrency, accounts, fsync)

	handler := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message, o order) error {
		_, err := tx.Exec(ctx, `UPDATE `+schema+`.accounts SET balance = balance + $1 WHERE id = $2`, o.Amount, o.Account)
		return err
	}
	var results []result
	var expected int64

	// Naive worker.
	msgs := messages("naive", naiveN, accounts)
	d, err := naive(ctx, pool, msgs, concurrency)
	if err != nil {
		return fmt.Errorf("naive: %w", err)
	}
	expected += int64(naiveN)
	results = append(results, result{"naive worker (BEGIN; check; INSERT; UPDATE; COMMIT)", naiveN, d})

	runs := []struct {
		name   string
		prefix string
		n      int
		batch  int
		store  dedup.TxStore[pgx.Tx]
		dup    bool
	}{
		{"idemq, batch 1", "b1", naiveN, 1, store, false},
		{"idemq, batch 100", "b100", batchN, 100, store, false},
		{"idemq, batch 100, no dedup record", "nodedup", batchN, 100, noRecord{store}, false},
		{"idemq, batch 100, all duplicates", "b100", batchN, 100, store, true},
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for _, r := range runs {
		msgs := messages(r.prefix, r.n, accounts)
		src := newSliceSource(msgs)
		runner, err := consumer.NewRunner(src, consumer.Transactional(r.store, consumer.TxJSON(handler)), consumer.Config{
			Name: "bench", Concurrency: concurrency, BatchSize: r.batch, Logger: logger,
		})
		if err != nil {
			return err
		}
		d, err := src.drain(ctx, runner)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		st := runner.Stats()
		if st.DeadLettered > 0 || st.Retried > 0 {
			return fmt.Errorf("%s: %d dead-lettered, %d retried", r.name, st.DeadLettered, st.Retried)
		}
		if r.dup && st.Duplicates != uint64(r.n) {
			return fmt.Errorf("%s: %d duplicates, want %d", r.name, st.Duplicates, r.n)
		}
		if !r.dup {
			expected += int64(r.n)
		}
		results = append(results, result{r.name, r.n, d})
	}

	var total int64
	if err := pool.QueryRow(ctx, `SELECT sum(balance) FROM `+schema+`.accounts`).Scan(&total); err != nil {
		return err
	}
	if total != expected {
		return fmt.Errorf("effects: sum of balances %d, want %d", total, expected)
	}

	base := results[0].rate()
	fmt.Printf("%-55s %9s %9s %11s %9s\n", "workload", "messages", "seconds", "msg/s", "vs naive")
	for _, r := range results {
		fmt.Printf("%-55s %9d %9.2f %11.0f %8.1fx\n", r.name, r.n, r.d.Seconds(), r.rate(), r.rate()/base)
	}
	with, without := results[2], results[3]
	overhead := (with.d.Seconds()/float64(with.n) - without.d.Seconds()/float64(without.n)) * 1000
	fmt.Printf("\ndedup record overhead at batch 100: %.4f ms per message (batch 100 vs batch 100 without record)\n", overhead)
	fmt.Printf("batch 100 vs naive: %.1fx\n", with.rate()/base)
	fmt.Printf("effects: sum of balances = %d = messages applied once each\n", total)
	return nil
}

func messages(prefix string, n, accounts int) []*consumer.Message {
	msgs := make([]*consumer.Message, n)
	for i := range msgs {
		body, _ := json.Marshal(order{Account: i % accounts, Amount: 1})
		// Partitioning by account keeps one account's updates in one lane,
		// so concurrent batches do not lock accounts in crossing orders.
		msgs[i] = &consumer.Message{
			ID: fmt.Sprintf("%s-%d", prefix, i), Body: body, PartitionKey: fmt.Sprint(i % accounts),
			Attempt: 1, ReceivedAt: time.Now(),
		}
	}
	return msgs
}

// naive is the per-message worker of the reference texts.
func naive(ctx context.Context, pool *pgxpool.Pool, msgs []*consumer.Message, concurrency int) (time.Duration, error) {
	work := make(chan *consumer.Message)
	errc := make(chan error, concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for range concurrency {
		wg.Go(func() {
			for m := range work {
				if err := naiveOne(ctx, pool, m); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	for _, m := range msgs {
		work <- m
	}
	close(work)
	wg.Wait()
	d := time.Since(start)
	select {
	case err := <-errc:
		return 0, err
	default:
		return d, nil
	}
}

func naiveOne(ctx context.Context, pool *pgxpool.Pool, m *consumer.Message) error {
	var o order
	if err := json.Unmarshal(m.Body, &o); err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var seen bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+schema+`.processed_messages WHERE scope = 'naive' AND key = $1)`, m.ID).Scan(&seen); err != nil {
		return err
	}
	if seen {
		return tx.Commit(ctx)
	}
	h := dedup.HashPayload(m.Body)
	if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.processed_messages (scope, key, payload_hash, expires_at) VALUES ('naive', $1, $2, now() + interval '72 hours')`, m.ID, h[:]); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE `+schema+`.accounts SET balance = balance + $1 WHERE id = $2`, o.Amount, o.Account); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// noRecord is the same store without the record: every key is new and
// nothing is written, to isolate the cost of deduplication.
type noRecord struct{ *pgdedup.Store }

func (noRecord) Claim(_ context.Context, _ pgx.Tx, _ string, recs []dedup.Record) ([]dedup.Claim, error) {
	cs := make([]dedup.Claim, len(recs))
	for i, r := range recs {
		cs[i] = dedup.Claim{Key: r.Key, State: dedup.StateNew}
	}
	return cs, nil
}

func (noRecord) Unclaim(context.Context, pgx.Tx, string, string) error { return nil }

// sliceSource serves a fixed slice of messages once and counts settlements.
type sliceSource struct {
	mu      sync.Mutex
	pending []*consumer.Message
	settled int
	total   int
	done    chan struct{}
}

func newSliceSource(msgs []*consumer.Message) *sliceSource {
	return &sliceSource{pending: msgs, total: len(msgs), done: make(chan struct{})}
}

func (s *sliceSource) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	for {
		s.mu.Lock()
		n := min(max, len(s.pending))
		out := s.pending[:n:n]
		s.pending = s.pending[n:]
		s.mu.Unlock()
		if n > 0 {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond): // retried messages come back later
		}
	}
}

func (s *sliceSource) settle(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled += n
	if s.settled == s.total {
		close(s.done)
	}
}

func (s *sliceSource) Ack(_ context.Context, msgs []*consumer.Message) error {
	s.settle(len(msgs))
	return nil
}

func (s *sliceSource) Retry(_ context.Context, m *consumer.Message, delay time.Duration) error {
	time.AfterFunc(delay, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		m.Attempt++
		s.pending = append(s.pending, m)
	})
	return nil
}

func (s *sliceSource) DeadLetter(context.Context, *consumer.Message, error) error {
	s.settle(1)
	return nil
}

func (s *sliceSource) Close() error { return nil }

// drain runs runner until every message is settled and returns the time it
// took.
func (s *sliceSource) drain(ctx context.Context, runner *consumer.Runner) (time.Duration, error) {
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- runner.Run(rctx) }()
	select {
	case <-s.done:
	case err := <-errc:
		return 0, fmt.Errorf("runner stopped early: %w", err)
	case <-ctx.Done():
		return 0, errors.New("timed out")
	}
	d := time.Since(start)
	stop()
	return d, <-errc
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
