// Command retention measures pgdedup's retention at full speed on a real
// PostgreSQL, with a records table of -rows rows (10 M by default):
//
//   - claim throughput of the transactional path (a consumer.Runner with the
//     batch API, TransactionalBatch, at batch size -batch and -concurrency
//     lanes, its handler writing nothing else, so the transaction is the
//     claim and the commit) on the idle table, and while the janitor deletes
//     a backlog of expired records as fast as it goes (store.Cleanup called
//     again as soon as it returns), in two rounds of alternating order, and
//     their ratio within each round; once for each janitor setting of
//     -janitors (by default none, back to back, then pgdedup's default
//     Config.CleanupBatchSize and Config.CleanupPause);
//   - the janitor's delete rate (rows/s) during those phases, against the
//     peak claim rate (the ingest rate it must keep up with);
//   - the latency of the claim (BEGIN and the claim's INSERT, one pipelined
//     round trip) and of the commit, p50 and p99, from a pgx tracer;
//   - after -cycles cleanup cycles with the last janitor setting (claims at
//     full speed with the janitor running for -phase, then one Cleanup to
//     the end), the table's and its indexes' size (pg_relation_size,
//     pg_indexes_size), the live and dead tuples and the vacuums of
//     pg_stat_user_tables.
//
// The table is created by the store's migrations and filled with one
// INSERT … SELECT generate_series in a schema of its own (dropped at the
// end, also on failure or interrupt): one scope, random keys (md5), rows in
// expiry order as a Runner writes them, the first -expired share of them
// expired already; the primary key is built after the insert. The claims use
// the same scope with new random keys, so they insert across the whole
// primary key index, and a retention of -retention (10 s), shorter than a
// phase, so that every cycle has records of the run itself to delete. Run it with `make
// bench-retention`; TEST_DATABASE_URL selects the server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/cmd/internal/bench/pgload"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
)

const (
	schema = "idemq_bench_retention"
	scope  = "orders"
)

type options struct {
	dsn         string
	rows        int
	expired     float64
	concurrency int
	batch       int
	phase       time.Duration
	janitors    []janitorSetting
	retention   time.Duration
	cycles      int
	cycleMax    time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", "", "PostgreSQL URL (default: $TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable)")
	flag.IntVar(&o.rows, "rows", 10_000_000, "records in the table before the run")
	flag.Float64Var(&o.expired, "expired", 0.7, "share of the records that expired already")
	flag.IntVar(&o.concurrency, "concurrency", 4, "Runner.Concurrency")
	flag.IntVar(&o.batch, "batch", 100, "Runner.BatchSize")
	flag.DurationVar(&o.phase, "phase", 20*time.Second, "duration of each measured phase")
	janitors := flag.String("janitors", "none,default", "janitor settings measured one after another, comma-separated, each [CleanupBatchSize/]CleanupPause (none: back to back; default: pgdedup's default); the last one runs the cycles")
	flag.DurationVar(&o.retention, "retention", 10*time.Second, "Config.Retention of the claims made by the run")
	flag.IntVar(&o.cycles, "cycles", 3, "cleanup cycles before the sizes are measured")
	flag.DurationVar(&o.cycleMax, "cycle-max", 10*time.Minute, "give up a cycle's final cleanup after this long")
	flag.Parse()
	for _, j := range strings.Split(*janitors, ",") {
		js, err := parseJanitor(strings.TrimSpace(j))
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -janitors:", err)
			os.Exit(2)
		}
		o.janitors = append(o.janitors, js)
	}
	if o.dsn == "" {
		o.dsn = envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable")
	}
	if o.expired <= 0 || o.expired >= 1 || o.rows < 1 {
		fmt.Fprintln(os.Stderr, "bench: -rows must be positive and -expired between 0 and 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		cancel()
		stop()
		os.Exit(1) //nolint:gocritic // the deferred calls ran above
	}
}

func run(ctx context.Context, o options) (err error) {
	admin, err := pgxpool.New(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	drop := `DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`
	if _, err := admin.Exec(ctx, drop); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	// Dropped at the end whatever happens, on a context of its own: ctx may
	// be the interrupted one.
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, derr := admin.Exec(dctx, drop); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop schema %s: %w", schema, derr))
		}
	}()
	b := &bench{o: o, admin: admin, table: schema + ".processed_messages",
		logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if err := b.fill(ctx); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	if err := b.open(ctx); err != nil {
		return err
	}
	defer b.pool.Close()
	defer b.jpool.Close()

	sz, err := pgload.Sizes(ctx, b.admin, b.table)
	if err != nil {
		return err
	}
	fmt.Printf("after fill: table %s, indexes %s, %d live and %d dead tuples\n", pgload.MiB(sz.Table), pgload.MiB(sz.Indexes), sz.Live, sz.Dead)
	var peak float64
	var last *pgdedup.Store
	for _, js := range o.janitors {
		janitor, err := pgdedup.New(b.jpool, pgdedup.Config{Schema: schema, CleanupBatchSize: js.batch, CleanupPause: js.pause})
		if err != nil {
			return err
		}
		last = janitor
		p, err := b.rounds(ctx, janitor)
		if err != nil {
			return err
		}
		peak = max(peak, p)
	}

	fmt.Printf("\ncleanup cycles (janitor pause %s): claims with the janitor running for %s, then one Cleanup to the end\n", pauseName(last.Config().CleanupPause), o.phase)
	fmt.Printf("%-6s %9s %9s %9s %10s %12s %12s %11s %11s %8s\n", "cycle", "claims/s", "deleted", "final del", "final secs", "table", "indexes", "live", "dead", "vacuums")
	if err := b.printSizes(ctx, "before"); err != nil {
		return err
	}
	for c := 1; c <= o.cycles; c++ {
		r, err := b.phase(ctx, last)
		if err != nil {
			return fmt.Errorf("cycle %d: %w", c, err)
		}
		cctx, cancel := context.WithTimeout(ctx, o.cycleMax)
		start := time.Now()
		n, err := last.Cleanup(cctx)
		cancel()
		if err != nil && ctx.Err() != nil {
			return err
		}
		final := time.Since(start)
		if err != nil {
			fmt.Printf("        cycle %d: final cleanup stopped after %s: %v\n", c, final.Round(time.Second), err)
		}
		fmt.Printf("%-6d %9.0f %9d %9d %10.1f ", c, r.rate(), r.deleted, n, final.Seconds())
		if err := b.printSizes(ctx, ""); err != nil {
			return err
		}
	}
	fmt.Printf("\npeak claim rate (ingest) %.0f/s\n", peak)
	return nil
}

// rounds measures claims on the idle table and with janitor running, in two
// rounds of alternating order, prints them and the ratios, and returns the
// highest claim rate.
func (b *bench) rounds(ctx context.Context, janitor *pgdedup.Store) (float64, error) {
	var peak float64
	var ratios, delRates []float64
	var lat latencies
	fmt.Printf("\njanitor: batch %d, pause %s\n", janitor.Config().CleanupBatchSize, pauseName(janitor.Config().CleanupPause))
	fmt.Printf("%-7s %-16s %9s %7s %9s %8s %9s %9s %10s %9s %10s\n", "round", "phase", "claims", "seconds", "claims/s", "ratio",
		"claim p50", "claim p99", "commit p99", "deleted", "deleted/s")
	for round := 1; round <= 2; round++ {
		order := []*pgdedup.Store{nil, janitor}
		if round == 2 {
			order = []*pgdedup.Store{janitor, nil}
		}
		var idle, busy phaseResult
		for _, j := range order {
			r, err := b.phase(ctx, j)
			if err != nil {
				return 0, fmt.Errorf("round %d: %w", round, err)
			}
			cleaning := j != nil
			if cleaning {
				busy = r
				delRates = append(delRates, r.deleteRate())
				lat.claim = append(lat.claim, r.claimLat...)
				lat.commit = append(lat.commit, r.commitLat...)
			} else {
				idle = r
			}
			peak = max(peak, r.rate())
			ratio := "-"
			if idle.n > 0 && busy.n > 0 {
				ratios = append(ratios, busy.rate()/idle.rate())
				ratio = fmt.Sprintf("%.2fx", busy.rate()/idle.rate())
			}
			name := "idle table"
			if cleaning {
				name = "janitor running"
			}
			fmt.Printf("%-7d %-16s %9d %7.1f %9.0f %8s %9s %9s %10s %9s %10s\n", round, name, r.n, r.d.Seconds(), r.rate(), ratio,
				pgload.Ms(pgload.Pct(r.claimLat, 0.50)), pgload.Ms(pgload.Pct(r.claimLat, 0.99)), pgload.Ms(pgload.Pct(r.commitLat, 0.99)), dash(cleaning, r.deleted), dashf(cleaning, r.deleteRate()))
			if r.ranOut {
				fmt.Printf("        (the janitor ran out of expired records after %.1f s: deleted/s is over that time)\n", r.active.Seconds())
			}
		}
	}
	fmt.Printf("claims with the janitor running vs idle table: %s (target >= 0.85x)\n", joinf(ratios, "%.2fx"))
	minDel := slices.Min(delRates)
	fmt.Printf("janitor delete rate while claims run: %s rows/s = %.2fx the peak claim rate %.0f/s (target >= 20000 rows/s and >= 1x)\n",
		joinf(delRates, "%.0f"), minDel/peak, peak)
	fmt.Printf("claim latency with the janitor running (both rounds): p50 %s, p99 %s, max %s; commit p99 %s\n",
		pgload.Ms(pgload.Pct(lat.claim, 0.5)), pgload.Ms(pgload.Pct(lat.claim, 0.99)), pgload.Ms(pgload.Pct(lat.claim, 1)), pgload.Ms(pgload.Pct(lat.commit, 0.99)))
	return peak, nil
}

// janitorSetting is one janitor configuration to measure.
type janitorSetting struct {
	batch int
	pause time.Duration
}

// parseJanitor parses [batch/]pause; pause is none, default or a duration.
func parseJanitor(s string) (janitorSetting, error) {
	def := pgdedup.Config{}.WithDefaults()
	js := janitorSetting{batch: def.CleanupBatchSize}
	if b, p, ok := strings.Cut(s, "/"); ok {
		n, err := strconv.Atoi(b)
		if err != nil || n < 1 {
			return js, fmt.Errorf("%q: batch size %q is not a positive number", s, b)
		}
		js.batch, s = n, p
	}
	switch s {
	case "none":
		js.pause = -1
	case "default":
		js.pause = def.CleanupPause
	default:
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return js, fmt.Errorf("pause %q is not none, default or a positive duration", s)
		}
		js.pause = d
	}
	return js, nil
}

func pauseName(d time.Duration) string {
	if d < 0 {
		return "none"
	}
	return d.String()
}

type latencies struct{ claim, commit []time.Duration }

type bench struct {
	o      options
	admin  *pgxpool.Pool
	table  string
	logger *slog.Logger
	pool   *pgxpool.Pool // the Runner's
	jpool  *pgxpool.Pool // the janitor's
	tracer *pgload.Tracer
	store  *pgdedup.Store
	keys   atomic.Int64
}

// fill creates the table through the store's migrations and fills it with
// one INSERT … SELECT generate_series: random keys, rows in expiry order,
// the first share expired. VACUUM ANALYZE then leaves it as autovacuum would
// in a steady state (visibility map and hint bits set, statistics current).
func (b *bench) fill(ctx context.Context) error {
	store, err := pgdedup.New(b.admin, pgdedup.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	exp := int(float64(b.o.rows) * b.o.expired)
	// Expired rows expire 1 ms apart up to 1 s ago; the others 1 ms apart
	// from 8 days on.
	insert := fmt.Sprintf(`INSERT INTO %s (scope, key, payload_hash, processed_at, expires_at)
SELECT '%s', md5('fill-' || i), sha256(int8send(i)), e - interval '8 days', e
FROM generate_series(1, %d) AS i,
LATERAL (SELECT CASE WHEN i <= %d THEN now() - interval '1 second' - (%d - i) * interval '1 millisecond'
                     ELSE now() + interval '8 days' + (i - %d) * interval '1 millisecond' END) AS x(e)`,
		b.table, scope, b.o.rows, exp, exp, exp)
	var version, syncCommit, sharedBuffers string
	_ = b.admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'), current_setting('shared_buffers')`).Scan(&version, &syncCommit, &sharedBuffers)
	fmt.Printf("retention benchmark: PostgreSQL %s (synchronous_commit=%s, shared_buffers=%s); %d records (%d expired); Runner batch API, batch %d, concurrency %d, claims kept %s; phases of %s\n",
		version, syncCommit, sharedBuffers, b.o.rows, exp, b.o.batch, b.o.concurrency, b.o.retention, b.o.phase)
	// The primary key is built once after the insert (sorted) rather than
	// row by row: the same index, in a fraction of the time.
	start := time.Now()
	for _, sql := range []string{
		`ALTER TABLE ` + b.table + ` DROP CONSTRAINT processed_messages_pkey`,
		insert,
		`ALTER TABLE ` + b.table + ` ADD CONSTRAINT processed_messages_pkey PRIMARY KEY (scope, key)`,
	} {
		if _, err := b.admin.Exec(ctx, sql); err != nil {
			return err
		}
	}
	fmt.Printf("filled in %.1f s", time.Since(start).Seconds())
	start = time.Now()
	if _, err := b.admin.Exec(ctx, `VACUUM (ANALYZE) `+b.table); err != nil {
		return err
	}
	fmt.Printf(", VACUUM ANALYZE in %.1f s\n", time.Since(start).Seconds())
	return nil
}

// open makes the Runner's traced pool and store and the janitor's own
// pool and store.
func (b *bench) open(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(b.o.dsn)
	if err != nil {
		return err
	}
	b.tracer = &pgload.Tracer{}
	cfg.ConnConfig.Tracer = b.tracer
	cfg.MaxConns = int32(b.o.concurrency + 1)
	cfg.MinConns = cfg.MaxConns
	if b.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	if b.jpool, err = pgxpool.New(ctx, b.o.dsn); err != nil {
		return err
	}
	b.store, err = pgdedup.New(b.pool, pgdedup.Config{Schema: schema, Retention: b.o.retention})
	return err
}

// phaseResult is one measured phase.
type phaseResult struct {
	n                   int64
	d                   time.Duration
	deleted             int64
	ranOut              bool
	activeDeleted       int64
	active              time.Duration // the janitor's time until it ran out of expired records, else 0
	claimLat, commitLat []time.Duration
}

func (r phaseResult) rate() float64 { return float64(r.n) / r.d.Seconds() }
func (r phaseResult) deleteRate() float64 {
	if r.active == 0 {
		return float64(r.deleted) / r.d.Seconds()
	}
	return float64(r.activeDeleted) / r.active.Seconds()
}

// phase runs the Runner for o.phase with new keys, with the janitor
// deleting at full speed alongside when cleaning, and returns the messages
// settled, the records deleted and the latencies the tracer saw.
func (b *bench) phase(ctx context.Context, janitor *pgdedup.Store) (phaseResult, error) {
	cleaning := janitor != nil
	src := &pgload.Source{Keys: &b.keys}
	runner, err := pgload.Runner(src, b.store, scope, consumer.Config{Concurrency: b.o.concurrency, BatchSize: b.o.batch, Logger: b.logger})
	if err != nil {
		return phaseResult{}, err
	}
	if err := b.pool.Ping(ctx); err != nil {
		return phaseResult{}, err
	}
	b.tracer.Reset()
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		res  phaseResult
		wg   sync.WaitGroup
		jerr error
	)
	start := time.Now()
	if cleaning {
		wg.Go(func() {
			for pctx.Err() == nil {
				n, err := janitor.Cleanup(pctx)
				res.deleted += n
				if pctx.Err() != nil {
					return
				}
				if err != nil {
					jerr = err
					return
				}
				// Caught up: from now on, clean once a second, as
				// RunJanitor would every CleanupInterval.
				if !res.ranOut {
					res.ranOut, res.active, res.activeDeleted = true, time.Since(start), res.deleted
				}
				select {
				case <-pctx.Done():
				case <-time.After(time.Second):
				}
			}
		})
	}
	rerr := make(chan error, 1)
	go func() { rerr <- runner.Run(pctx) }()
	select {
	case <-time.After(b.o.phase):
	case err := <-rerr:
		stop()
		wg.Wait()
		return res, fmt.Errorf("runner stopped early: %w", err)
	case <-ctx.Done():
	}
	stop()
	err = <-rerr
	res.d = time.Since(start)
	wg.Wait()
	if err != nil {
		return res, fmt.Errorf("runner: %w", err)
	}
	if jerr != nil {
		return res, fmt.Errorf("janitor: %w", jerr)
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	st := runner.Stats()
	if st.DeadLettered > 0 || st.Retried > 0 || st.Duplicates > 0 {
		return res, fmt.Errorf("%d dead-lettered, %d retried, %d duplicates: every key is new", st.DeadLettered, st.Retried, st.Duplicates)
	}
	res.n = src.Acked.Load()
	res.claimLat, res.commitLat = b.tracer.Take()
	return res, nil
}

// printSizes prints the table's and indexes' size and its tuples.
func (b *bench) printSizes(ctx context.Context, label string) error {
	sz, err := pgload.Sizes(ctx, b.admin, b.table)
	if err != nil {
		return err
	}
	if label != "" {
		fmt.Printf("%-6s %9s %9s %9s %10s ", label, "-", "-", "-", "-")
	}
	fmt.Printf("%12s %12s %11d %11d %8d\n", pgload.MiB(sz.Table), pgload.MiB(sz.Indexes), sz.Live, sz.Dead, sz.Vacuums)
	return nil
}

func dash(on bool, n int64) string {
	if !on {
		return "-"
	}
	return fmt.Sprint(n)
}

func dashf(on bool, f float64) string {
	if !on {
		return "-"
	}
	return fmt.Sprintf("%.0f", f)
}

func joinf(fs []float64, format string) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = fmt.Sprintf(format, f)
	}
	return strings.Join(s, ", ")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
