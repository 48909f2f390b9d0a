// Command lease measures idemq's lease path against the ceiling of the Redis
// work it does, in one run, at the same concurrency:
//
//   - claim: a raw go-redis loop running the store's Lua claim (one EVALSHA
//     per message), the ceiling the lease path is compared with;
//   - claim+complete: the same loop also marking each key done, which is
//     all the Redis work the lease path does per message;
//   - runner: consumer.Leased on the in-memory source (consumer/memsource)
//     with the Redis store and a no-op effect, from the first receive to the
//     last acknowledgement, at batch size 1 (a claim and a completion per
//     message), 16 (one claim round trip per batch, a completion per
//     message) and at the default config (BatchSize left 0);
//   - batch API: the store's ClaimBatch and CompleteBatch, 16 keys per
//     pipeline, the Redis work of a path that also completed per batch.
//
// It prints messages per second, the runner's ratio to each baseline, and
// the Redis round trips per message (a go-redis hook counts a command sent
// alone or a pipeline as one), of the best round.
//
//	go -C cmd/internal run ./bench/lease -n 20000 -concurrency 8
//
// The Redis address comes from -redis, else TEST_REDIS_URL, else
// redis://127.0.0.1:6379/0. Keys are written under a fresh scope and expire
// within two minutes.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/cmd/internal/bench/handwritten"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisdedup"
)

const (
	lease     = 30 * time.Second
	retention = 2 * time.Minute
)

func main() {
	n := flag.Int("n", 20000, "messages per measurement")
	concurrency := flag.Int("concurrency", 8, "goroutines of the raw loops and Config.Concurrency of the runner")
	rounds := flag.Int("rounds", 3, "runs of each measurement; the best is reported")
	url := flag.String("redis", "", "Redis URL (default: $TEST_REDIS_URL, else redis://127.0.0.1:6379/0)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *url == "" {
		*url = envOr("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
	}
	stopProfile, err := handwritten.StartCPUProfile(*cpuprofile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lease bench:", err)
		os.Exit(1)
	}
	err = run(os.Stdout, *url, *n, *concurrency, *rounds)
	stopProfile()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lease bench:", err)
		os.Exit(1)
	}
}

func run(out io.Writer, url string, n, concurrency, rounds int) error {
	if n < 1 || concurrency < 1 || rounds < 1 {
		return errors.New("-n, -concurrency and -rounds must be at least 1")
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return fmt.Errorf("parse %s: %w", url, err)
	}
	opts.PoolSize = max(opts.PoolSize, 2*concurrency)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	trips := &tripCounter{}
	rdb.AddHook(trips)
	ctx := context.Background()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("redis at %s: %w", opts.Addr, err)
	}
	store, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		return err
	}

	measures := []struct {
		name string
		fn   func(ctx context.Context, store *redisdedup.Store, n, concurrency int) (time.Duration, error)
	}{
		{"raw Lua claim (go-redis loop)", rawClaim(false)},
		{"raw Lua claim + complete", rawClaim(true)},
		{"runner lease path, batch 1", runnerPath(1)},
		{fmt.Sprintf("runner lease path, batch %d", batch), runnerPath(batch)},
		{"runner lease path, default config", runnerPath(0)},
		{fmt.Sprintf("batch API: claim+complete ×%d", batch), rawBatch(batch)},
	}
	// Warm up connections and the script cache.
	if _, err := rawClaim(true)(ctx, store, min(n, 1000), concurrency); err != nil {
		return err
	}
	best := make([]float64, len(measures))
	rt := make([]float64, len(measures))
	for range rounds {
		for i, m := range measures {
			t0 := trips.n.Load()
			d, err := m.fn(ctx, store, n, concurrency)
			if err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			if rate := float64(n) / d.Seconds(); rate > best[i] {
				best[i] = rate
				rt[i] = float64(trips.n.Load()-t0) / float64(n)
			}
		}
	}

	fmt.Fprintf(out, "lease path throughput: %d messages, concurrency %d, best of %d, Redis %s at %s, GOMAXPROCS %d\n",
		n, concurrency, rounds, field(info, "redis_version"), opts.Addr, runtime.GOMAXPROCS(0))
	fmt.Fprintf(out, "  %-34s %10s %9s  %s\n", "", "msg/s", "trips/msg", "ratio")
	fmt.Fprintf(out, "  %-34s %10.0f %9.3f  1.00 (ceiling)\n", measures[0].name, best[0], rt[0])
	fmt.Fprintf(out, "  %-34s %10.0f %9.3f  %.2f of the ceiling\n", measures[1].name, best[1], rt[1], best[1]/best[0])
	for _, i := range []int{2, 3, 4} {
		fmt.Fprintf(out, "  %-34s %10.0f %9.3f  %.2f of the ceiling, %.2f of claim + complete\n", measures[i].name, best[i], rt[i], best[i]/best[0], best[i]/best[1])
	}
	fmt.Fprintf(out, "  %-34s %10.0f %9.3f  %.2f of the ceiling (ClaimBatch + CompleteBatch, one pipeline each)\n",
		measures[5].name, best[5], rt[5], best[5]/best[0])
	return nil
}

// rawClaim returns a measurement of concurrency goroutines claiming n fresh
// keys (and completing them when complete is true) as fast as they can.
func rawClaim(complete bool) func(ctx context.Context, store *redisdedup.Store, n, concurrency int) (time.Duration, error) {
	return func(ctx context.Context, store *redisdedup.Store, n, concurrency int) (time.Duration, error) {
		scope := randomName("bench-raw")
		hash := dedup.HashPayload([]byte("{}"))
		var next atomic.Int64
		errs := make([]error, concurrency)
		var wg sync.WaitGroup
		start := time.Now()
		for g := range concurrency {
			wg.Go(func() {
				tok := randomName("tok")
				for {
					i := next.Add(1)
					if i > int64(n) {
						return
					}
					key := "k" + fmt.Sprint(i)
					c, err := store.Claim(ctx, scope, dedup.Record{Key: key, PayloadHash: hash}, tok, lease)
					if err == nil && c.State != dedup.StateNew {
						err = fmt.Errorf("claim of a fresh key: %v", c.State)
					}
					if err == nil && complete {
						err = store.Complete(ctx, scope, key, tok, retention)
					}
					if err != nil {
						errs[g] = err
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start), errors.Join(errs...)
	}
}

// batch is the batch size of the rawBatch measurement.
const batch = 16

// rawBatch returns a measurement of concurrency goroutines claiming and then
// completing fresh keys size at a time with the store's batch API: what a
// lease path that claims and completes a batch per round trip could reach.
func rawBatch(size int) func(ctx context.Context, store *redisdedup.Store, n, concurrency int) (time.Duration, error) {
	return func(ctx context.Context, store *redisdedup.Store, n, concurrency int) (time.Duration, error) {
		scope := randomName("bench-batch")
		hash := dedup.HashPayload([]byte("{}"))
		var next atomic.Int64
		errs := make([]error, concurrency)
		var wg sync.WaitGroup
		start := time.Now()
		for g := range concurrency {
			wg.Go(func() {
				recs := make([]dedup.Record, 0, size)
				keys := make([]string, 0, size)
				toks := make([]string, 0, size)
				tok := randomName("tok")
				for {
					first := next.Add(int64(size)) - int64(size)
					if first >= int64(n) {
						return
					}
					recs, keys, toks = recs[:0], keys[:0], toks[:0]
					for i := first; i < min(first+int64(size), int64(n)); i++ {
						key := "k" + fmt.Sprint(i)
						recs = append(recs, dedup.Record{Key: key, PayloadHash: hash})
						keys = append(keys, key)
						toks = append(toks, tok)
					}
					claims, err := store.ClaimBatch(ctx, scope, recs, toks, lease)
					for _, c := range claims {
						if err == nil && c.State != dedup.StateNew {
							err = fmt.Errorf("claim of a fresh key: %v", c.State)
						}
					}
					if err == nil {
						var results []error
						results, err = store.CompleteBatch(ctx, scope, keys, toks, retention)
						err = errors.Join(append(results, err)...)
					}
					if err != nil {
						errs[g] = err
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start), errors.Join(errs...)
	}
}

// runnerPath returns a measurement that publishes n messages to an
// in-memory topic, then runs the lease path over them at batch size batch
// with a no-op effect until all are acknowledged.
func runnerPath(batch int) func(ctx context.Context, store *redisdedup.Store, n, concurrency int) (time.Duration, error) {
	return func(ctx context.Context, store *redisdedup.Store, n, concurrency int) (time.Duration, error) {
		return runLeasePath(ctx, store, n, concurrency, batch)
	}
}

func runLeasePath(ctx context.Context, store *redisdedup.Store, n, concurrency, batch int) (time.Duration, error) {
	broker := memsource.New(memsource.Config{})
	defer broker.Close()
	topic := randomName("bench")
	body := []byte("{}")
	for i := range n {
		broker.Publish(topic, memsource.Outgoing{Key: fmt.Sprintf("k%d", i), Body: body})
	}
	src := broker.Source(topic)
	defer src.Close()
	noop := func(context.Context, *consumer.Message) error { return nil }
	r, err := consumer.NewRunner(src, consumer.Leased(store, noop, consumer.LeaseOptions{Lease: lease, Retention: retention}),
		consumer.Config{Name: randomName("bench-runner"), Concurrency: concurrency, BatchSize: batch})
	if err != nil {
		return 0, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Run(runCtx) }()
	// Poll the runner's atomic counters, not the broker (whose lock the
	// runner needs), so that watching costs the measurement nothing.
	for r.Stats().Handled < uint64(n) {
		select {
		case err := <-done:
			return 0, fmt.Errorf("runner stopped early: %w", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	if st, acks := r.Stats(), broker.Stats(topic).Acks; st.Handled != uint64(n) || acks != uint64(n) {
		return 0, fmt.Errorf("runner handled %d and acknowledged %d of %d messages (stats %+v)", st.Handled, acks, n, st)
	}
	return elapsed, nil
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// field returns the value of name in the text of INFO.
func field(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return "?"
}

// tripCounter is a go-redis hook that counts round trips: a command sent
// alone or a pipeline is one.
type tripCounter struct{ n atomic.Int64 }

func (t *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (t *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t.n.Add(1)
		return next(ctx, cmd)
	}
}

func (t *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t.n.Add(1)
		return next(ctx, cmds)
	}
}
