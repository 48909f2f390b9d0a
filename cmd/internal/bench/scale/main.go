// Command scale measures pgdedup at the documented load: 10 M messages a
// day kept for the 8-day retention, 80 M records in processed_messages. For
// each layout of -layouts it:
//
//   - creates the table through the store's migrations in a schema of its
//     own and, for the filled layouts, fills it with -rows records over
//     -days UTC days (random UUID keys of 36 bytes, four scopes in turn,
//     random 32-byte payload hashes) with binary COPY … FREEZE (the primary
//     key built after it); the fill is setup, not measured;
//   - runs the real Runner (consumer.Runner, the batch API at -batch and
//     -concurrency, new random UUID keys from an in-process source, as fast
//     as it takes them) for at least -run, with the store's janitor active
//     (Cleanup, and again a second after it returns, at pgdedup's default
//     batch and pause; a failed Cleanup is counted and retried, as
//     RunJanitor does), while -cycles days roll over; the run lasts until
//     each rolled-over day is gone (at most -cycle-max after the last
//     rollover);
//   - prints claims/s, the claim's latency (BEGIN and the claim's
//     statements, one pipelined round trip, from a pgx tracer) p50/p99/max,
//     WAL bytes per claim (pg_current_wal_lsn before and after the run, the
//     janitor's WAL included), bytes per record on disk after the fill (heap,
//     and indexes), the time each rolled-over day took to go (from the
//     janitor's first transaction after the rollover to the commit that
//     removed its last records) with the claims' p99 and max latency
//     meanwhile (for a drop: the lock wait the claims see), and the table's
//     size and dead tuples after the run.
//
// The layouts:
//
//   - empty: today's table, nothing in it, nothing expires;
//   - delete: today's table, filled, the DELETE janitor. Its clock is the
//     time, so the fill dates the oldest days to expire at the rollovers,
//     -cycle apart, choosing them when the COPY gets to those days;
//   - partitioned: the table partitioned by day (pgdedup.Config.Partitioned),
//     filled one partition per day; a rollover moves the store's clock
//     (Config.Now) a day on and the janitor drops the oldest partition;
//   - partitioned-empty: the partitioned store on an empty table.
//
// Then it checks the goals of each filled layout against the empty tables:
// claims/s >= 0.9x, claim p99 <= 1.2x, a day's retention under 1 s with no
// dead tuple left, at most 100 bytes of heap per record. Every figure is
// measured; a goal not met is printed as such and does not fail the run.
// After the layouts it measures the other stores at the same volume:
// SQLite's bytes per record and claims/s after -sqlite-records records,
// and Redis's memory per key after -redis-keys done keys, each extrapolated
// to -rows.
//
// The server is a PostgreSQL cluster of its own (initdb into a temporary
// directory, on a free loopback port, removed at the end; as the postgres
// user when run as root), loaded with wal_level=minimal and restarted with
// wal_level=replica for the measured runs; IDEMQ_BENCH_PG_DSN (or -dsn)
// selects an existing server instead, whose wal_level is left alone. Redis
// is a redis-server of its own, SQLite a file in a temporary directory.
// -mode short (2 M records, 25 s runs, a few minutes) is what CI runs;
// -mode long (80 M records, 5 min runs) is `make bench-scale`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/cmd/internal/bench/pgload"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
)

const schemaPrefix = "idemq_bench_scale_"

type options struct {
	mode          string
	dsn           string
	rows          int
	days          int
	cycles        int
	run           time.Duration
	cycle         time.Duration
	lead          time.Duration
	cycleMax      time.Duration
	postFactor    float64
	concurrency   int
	batch         int
	layouts       []string
	sharedBuffers string
	timeout       time.Duration
	redisKeys     int
	sqliteRecords int
}

// modes are the defaults of -mode; flags given explicitly win.
var modes = map[string]options{
	"short": {rows: 2_000_000, run: 25 * time.Second, cycle: 10 * time.Second, lead: 3 * time.Second, cycleMax: 2 * time.Minute, sharedBuffers: "512MB", timeout: 10 * time.Minute, redisKeys: 100_000, sqliteRecords: 100_000},
	"long":  {rows: 80_000_000, run: 5 * time.Minute, cycle: 150 * time.Second, lead: 60 * time.Second, cycleMax: 10 * time.Minute, sharedBuffers: "2GB", timeout: 3 * time.Hour, redisKeys: 5_000_000, sqliteRecords: 1_000_000},
}

func main() {
	var o options
	flag.StringVar(&o.mode, "mode", "short", "short (2 M records, 25 s runs: CI) or long (80 M records, 5 min runs); sets the defaults of -rows, -run, -cycle, -lead, -cycle-max, -shared-buffers, -timeout")
	flag.StringVar(&o.dsn, "dsn", "", "PostgreSQL URL of an existing server (default: $IDEMQ_BENCH_PG_DSN, else a cluster of its own)")
	flag.IntVar(&o.rows, "rows", 0, "records filled before the run (the documented load: 80 M)")
	flag.IntVar(&o.days, "days", 8, "days of retention the records span")
	flag.IntVar(&o.cycles, "cycles", 3, "days rolled over (retention cycles) during each run")
	flag.DurationVar(&o.run, "run", 0, "shortest measured run of each layout")
	flag.DurationVar(&o.cycle, "cycle", 0, "time between two rollovers")
	flag.DurationVar(&o.lead, "lead", 0, "planned time from the run's start to the first rollover")
	flag.DurationVar(&o.cycleMax, "cycle-max", 0, "stop waiting for the last day's retention after this long")
	flag.Float64Var(&o.postFactor, "post-factor", 2, "time of the primary key build and restart after the COPY, as a share of the COPY's, to date the first rollover")
	flag.IntVar(&o.concurrency, "concurrency", 4, "Runner.Concurrency")
	flag.IntVar(&o.batch, "batch", 100, "Runner.BatchSize")
	layouts := flag.String("layouts", "empty,partitioned-empty,partitioned,delete", "layouts measured, in order, comma-separated: empty, partitioned-empty (the partitioned store on an empty table), partitioned, delete")
	flag.StringVar(&o.sharedBuffers, "shared-buffers", "", "shared_buffers of the cluster of its own")
	flag.DurationVar(&o.timeout, "timeout", 0, "give up the whole benchmark after this long")
	flag.IntVar(&o.sqliteRecords, "sqlite-records", -1, "records claimed through sqldedup into a SQLite file of its own to measure its size per record, after the layouts (0: none; default: 100,000 short, 1 M long)")
	flag.IntVar(&o.redisKeys, "redis-keys", -1, "keys written through redisdedup into a redis-server of its own to measure its memory per key, after the layouts (0: none; default: 100,000 short, 5 M long)")
	flag.Parse()
	def, ok := modes[o.mode]
	if !ok {
		fmt.Fprintln(os.Stderr, "bench: -mode must be short or long")
		os.Exit(2)
	}
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	pick := func(name string, v *time.Duration, d time.Duration) {
		if !set[name] {
			*v = d
		}
	}
	if !set["rows"] {
		o.rows = def.rows
	}
	pick("run", &o.run, def.run)
	pick("cycle", &o.cycle, def.cycle)
	pick("lead", &o.lead, def.lead)
	pick("cycle-max", &o.cycleMax, def.cycleMax)
	pick("timeout", &o.timeout, def.timeout)
	if !set["shared-buffers"] {
		o.sharedBuffers = def.sharedBuffers
	}
	if !set["redis-keys"] {
		o.redisKeys = def.redisKeys
	}
	if !set["sqlite-records"] {
		o.sqliteRecords = def.sqliteRecords
	}
	for _, l := range strings.Split(*layouts, ",") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		if _, ok := layoutKinds[l]; !ok {
			fmt.Fprintf(os.Stderr, "bench: -layouts: unknown layout %q\n", l)
			os.Exit(2)
		}
		o.layouts = append(o.layouts, l)
	}
	if o.dsn == "" {
		o.dsn = os.Getenv("IDEMQ_BENCH_PG_DSN")
	}
	if o.rows < o.days || o.days < 2 || o.cycles < 1 || o.cycles >= o.days {
		fmt.Fprintln(os.Stderr, "bench: need -rows >= -days >= 2 and 1 <= -cycles < -days")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		cancel()
		stop()
		os.Exit(1) //nolint:gocritic // the deferred calls ran above
	}
}

func run(ctx context.Context, o options) error {
	if len(o.layouts) > 0 {
		if err := runPostgres(ctx, o); err != nil {
			return err
		}
	}
	if o.sqliteRecords > 0 {
		if err := sqliteSize(ctx, o.sqliteRecords, o.rows, o.batch); err != nil {
			return err
		}
	}
	if o.redisKeys > 0 {
		return redisMemory(ctx, o.redisKeys, o.rows)
	}
	return nil
}

func runPostgres(ctx context.Context, o options) (err error) {
	b := &bench{o: o, logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	dsn := o.dsn
	if dsn == "" {
		start := time.Now()
		b.srv, err = startServer(ctx, []string{
			"shared_buffers = " + o.sharedBuffers, "max_wal_size = 8GB", "min_wal_size = 1GB",
			"checkpoint_timeout = 15min", "maintenance_work_mem = 2GB", "max_connections = 50",
		}, "replica")
		if err != nil {
			return fmt.Errorf("private server: %w", err)
		}
		defer b.srv.stop()
		dsn = b.srv.dsn()
		fmt.Printf("private PostgreSQL cluster on 127.0.0.1:%s (%s), started in %.1f s\n", b.srv.port, b.srv.dir, time.Since(start).Seconds())
	}
	b.dsn = dsn
	if err := b.connect(ctx); err != nil {
		return err
	}
	defer func() { b.admin.Close() }()
	var version, syncCommit, sharedBuffers, collate string
	_ = b.admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'), current_setting('shared_buffers'),
       (SELECT datcollate FROM pg_database WHERE datname = current_database())`).Scan(&version, &syncCommit, &sharedBuffers, &collate)
	fmt.Printf("scale benchmark (-mode %s): PostgreSQL %s (synchronous_commit=%s, shared_buffers=%s, collation %s); %d records over %d days (%d a day), %d rollovers %s apart; Runner batch API, batch %d, concurrency %d; runs of at least %s\n",
		o.mode, version, syncCommit, sharedBuffers, collate, o.rows, o.days, o.rows/o.days, o.cycles, o.cycle, o.batch, o.concurrency, o.run)

	var results []*result
	for _, name := range o.layouts {
		r, err := b.layout(ctx, name)
		if err != nil {
			// What was measured is printed all the same (an interrupt
			// or -timeout stops a long run).
			if len(results) > 0 {
				fmt.Printf("\n%s did not finish; the layouts measured before it:\n", name)
				report(o, results)
			}
			return fmt.Errorf("%s: %w", name, err)
		}
		results = append(results, r)
	}
	report(o, results)
	return nil
}

type bench struct {
	o      options
	dsn    string
	srv    *server // nil with an existing server
	admin  *pgxpool.Pool
	logger *slog.Logger
	keys   atomic.Int64
}

func (b *bench) connect(ctx context.Context) error {
	var err error
	b.admin, err = pgxpool.New(ctx, b.dsn)
	if err == nil {
		err = b.admin.Ping(ctx)
	}
	return err
}

// setWAL restarts the private server with wal_level wal (nothing on an
// existing server) and reconnects.
func (b *bench) setWAL(ctx context.Context, wal string) error {
	if b.srv == nil || b.srv.wal == wal {
		return nil
	}
	b.admin.Close()
	start := time.Now()
	if err := b.srv.setWAL(ctx, wal); err != nil {
		return err
	}
	fmt.Printf("  restarted with wal_level=%s in %.1f s\n", wal, time.Since(start).Seconds())
	return b.connect(ctx)
}

// layoutKinds are the layouts -layouts accepts, and whether they are
// filled.
var layoutKinds = map[string]bool{"empty": false, "delete": true, "partitioned": true, "partitioned-empty": false}

// cycle is one day's retention during a run.
type cycle struct {
	at      time.Time // its rollover
	started time.Time // the janitor's first transaction after it
	done    time.Time // the commit that removed the day's last records (zero: not seen)
}

// result is one layout's run.
type result struct {
	name                string
	filled              int64
	copyTime, indexTime time.Duration
	fill                pgload.Size // after the fill (the run's claims for the empty table)
	start               time.Time
	claims              int64
	d                   time.Duration
	claimLat, commitLat []pgload.Sample
	wal                 int64
	cycles              []cycle
	janitorErrs         []string // the failed cleanups, each retried a second later
	after               pgload.Size
}

func (r *result) rate() float64 { return float64(r.claims) / r.d.Seconds() }

// clock is the store's clock of the partitioned layout (Config.Now): the
// time plus a day for each rollover.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

func (c *clock) rollover() { c.offset.Add(int64(24 * time.Hour)) }

// run is how a layout's run goes: the stores' config, when its days roll
// over, what a rollover does, and when the janitor has removed day k.
type runPlan struct {
	store     pgdedup.Config
	rollovers []time.Time
	advance   func() // nil: the rollovers are dated in the records
	gone      func(k int, deleted, drops int64) bool
}

// layout creates, fills, runs and drops one layout's table.
func (b *bench) layout(ctx context.Context, name string) (res *result, err error) {
	schema := schemaPrefix + strings.ReplaceAll(name, "-", "_")
	table := schema + ".processed_messages"
	drop := func() error {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		_, err := b.admin.Exec(dctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		return err
	}
	if err := drop(); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	defer func() {
		if derr := drop(); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop schema %s: %w", schema, derr))
		}
	}()
	fmt.Printf("\n%s: ", name)
	res = &result{name: name}
	clk := &clock{}
	rp := runPlan{store: pgdedup.Config{Schema: schema}}
	if strings.HasPrefix(name, "partitioned") {
		rp.store.Partitioned, rp.store.Now = true, clk.now
	}
	mig, err := pgdedup.New(b.admin, rp.store)
	if err != nil {
		return nil, err
	}
	if err := mig.Migrate(ctx); err != nil {
		return nil, err
	}
	if !layoutKinds[name] {
		fmt.Println("no records, nothing expires")
	} else {
		fmt.Printf("filling %d records\n", b.o.rows)
		if err := b.setWAL(ctx, "minimal"); err != nil {
			return nil, err
		}
		p := plan{rows: b.o.rows, days: b.o.days, cycles: b.o.cycles, start: time.Now()}
		perDay := int64(p.perDay())
		if name == "delete" {
			// The DELETE janitor's clock is the time: the oldest days are
			// dated to expire at the rollovers, chosen when the COPY gets
			// to them (the other days written first) from its rate so far.
			var e0 time.Time
			p.firstExpiry = func(left int) error {
				el := time.Since(p.start)
				rate := float64(b.o.rows-left) / el.Seconds()
				rest := time.Duration(float64(left) / rate * float64(time.Second))
				post := time.Duration(b.o.postFactor * float64(el+rest))
				e0 = time.Now().Add(rest + post + 10*time.Second + b.o.lead).Truncate(time.Second)
				return nil
			}
			p.expiry = func(day int) time.Time { return e0.Add(time.Duration(day) * b.o.cycle) }
			res.copyTime, res.indexTime, err = fillTable(ctx, b.admin, table, schema+".processed_messages_expires_at_idx", p)
			for k := range b.o.cycles {
				rp.rollovers = append(rp.rollovers, p.expiry(k))
			}
			rp.gone = func(k int, deleted, _ int64) bool { return deleted >= int64(k+1)*perDay }
		} else {
			// Today's partition is the clock's, created by the migration;
			// the fill's days are the 8 before. A rollover moves the clock
			// a day on: the oldest day's partition is then a retention past
			// its day, and the janitor drops it.
			res.copyTime, res.indexTime, err = fillPartitions(ctx, b.admin, schema, "processed_messages", p)
			rp.advance = clk.rollover
			rp.gone = func(k int, _, drops int64) bool { return drops >= int64(k+1) }
		}
		if err != nil {
			return nil, fmt.Errorf("fill: %w", err)
		}
		res.filled = int64(b.o.rows)
		fmt.Printf("  COPY FREEZE in %.1f s (%.0f rows/s), primary key, BRIN summary or ATTACH, and ANALYZE in %.1f s\n",
			res.copyTime.Seconds(), float64(b.o.rows)/res.copyTime.Seconds(), res.indexTime.Seconds())
		if err := b.setWAL(ctx, "replica"); err != nil {
			return nil, err
		}
		if rp.store.Partitioned {
			// Today's partition and the next days', before any claim.
			st, err := pgdedup.New(b.admin, rp.store)
			if err == nil {
				_, err = st.Cleanup(ctx)
			}
			if err != nil {
				return nil, err
			}
		}
		if res.fill, err = pgload.Sizes(ctx, b.admin, table); err != nil {
			return nil, err
		}
		fmt.Printf("  after the fill: heap %s, indexes %s: %.1f + %.1f bytes per record\n", pgload.MiB(res.fill.Table), pgload.MiB(res.fill.Indexes),
			float64(res.fill.Table)/float64(res.filled), float64(res.fill.Indexes)/float64(res.filled))
	}
	if err := b.measure(ctx, res, table, rp); err != nil {
		return res, err
	}
	if !layoutKinds[name] {
		// The empty table's bytes per record are those of the run's claims.
		res.fill = res.after
		res.filled = res.after.Live
	}
	return res, nil
}

// measure runs the Runner and the janitor on the layout's table until
// -run has passed and every rollover's day is gone.
func (b *bench) measure(ctx context.Context, res *result, table string, rp runPlan) error {
	cfg, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		return err
	}
	tracer := &pgload.Tracer{}
	cfg.ConnConfig.Tracer = tracer
	cfg.MaxConns = int32(b.o.concurrency + 1)
	cfg.MinConns = cfg.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	jpool, err := pgxpool.New(ctx, b.dsn)
	if err != nil {
		return err
	}
	defer jpool.Close()
	store, err := pgdedup.New(pool, rp.store)
	if err != nil {
		return err
	}
	src := &pgload.Source{Keys: &b.keys, Key: pgload.UUID}
	runner, err := pgload.Runner(src, store, fillScopes[0], consumer.Config{Concurrency: b.o.concurrency, BatchSize: b.o.batch, Logger: b.logger})
	if err != nil {
		return err
	}
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	// Every run starts from a checkpoint: full-page writes count alike.
	if _, err := b.admin.Exec(ctx, `CHECKPOINT`); err != nil {
		return err
	}
	var lsn0 string
	if err := b.admin.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn0); err != nil {
		return err
	}
	if rp.advance != nil {
		// The clock's rollovers fit in the run.
		every := min(b.o.cycle, (b.o.run-b.o.lead)/time.Duration(b.o.cycles))
		rp.rollovers = nil
		for k := range b.o.cycles {
			rp.rollovers = append(rp.rollovers, time.Now().Add(b.o.lead+time.Duration(k)*every))
		}
	}
	res.cycles = make([]cycle, len(rp.rollovers))
	for k, at := range rp.rollovers {
		res.cycles[k].at = at
	}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	// A day is gone when the janitor's committed deletions, or its
	// partitions dropped, since the run's start pass it (rp.gone): only the
	// rolled-over days have expired records.
	jdb := &countingDB{Pool: jpool,
		began: func(at time.Time) {
			mu.Lock()
			defer mu.Unlock()
			for k := range res.cycles {
				c := &res.cycles[k]
				if c.started.IsZero() && !at.Before(c.at) && !c.at.IsZero() {
					c.started = at
				}
			}
		},
		committed: func(deleted, drops int64, at time.Time) {
			mu.Lock()
			defer mu.Unlock()
			for k := range res.cycles {
				c := &res.cycles[k]
				if c.done.IsZero() && !c.started.IsZero() && rp.gone(k, deleted, drops) {
					c.done = at
				}
			}
		}}
	jcfg := rp.store
	jcfg.Logger = b.logger
	janitor, err := pgdedup.New(jdb, jcfg)
	if err != nil {
		return err
	}
	jctx, jstop := context.WithCancel(ctx)
	defer jstop()
	// The janitor: Cleanup, and again a second after it returns (RunJanitor
	// does the same every CleanupInterval).
	wg.Go(func() {
		for jctx.Err() == nil {
			_, err := janitor.Cleanup(jctx)
			if jctx.Err() != nil {
				return
			}
			if err != nil {
				// RunJanitor logs a failed cleanup and tries again at its
				// next tick: so does this loop, counting them.
				mu.Lock()
				res.janitorErrs = append(res.janitorErrs, fmt.Sprintf("%+.1f s: %v", time.Since(res.start).Seconds(), err))
				mu.Unlock()
			}
			select {
			case <-jctx.Done():
			case <-time.After(time.Second):
			}
		}
	})
	tracer.Reset()
	rctx, rstop := context.WithCancel(ctx)
	defer rstop()
	res.start = time.Now()
	fmt.Printf("  run: started")
	for k, at := range rp.rollovers {
		fmt.Printf("; rollover %d at %+.0f s", k+1, at.Sub(res.start).Seconds())
	}
	fmt.Println()
	rerr := make(chan error, 1)
	go func() { rerr <- runner.Run(rctx) }()
	if rp.advance != nil {
		wg.Go(func() {
			for k, at := range rp.rollovers {
				select {
				case <-jctx.Done():
					return
				case <-time.After(time.Until(at)):
				}
				mu.Lock()
				res.cycles[k].at = time.Now()
				rp.advance()
				mu.Unlock()
			}
		})
	}
	deadline := res.start.Add(b.o.run)
	if n := len(rp.rollovers); n > 0 {
		deadline = maxTime(deadline, rp.rollovers[n-1]).Add(b.o.cycleMax)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var runErr error
wait:
	for {
		select {
		case <-ctx.Done():
			runErr = ctx.Err()
			break wait
		case err := <-rerr:
			rerr <- err
			runErr = fmt.Errorf("runner stopped early: %w", err)
			break wait
		case now := <-tick.C:
			mu.Lock()
			done := true
			for _, c := range res.cycles {
				done = done && !c.done.IsZero()
			}
			mu.Unlock()
			if (done && now.Sub(res.start) >= b.o.run) || now.After(deadline) {
				break wait
			}
		}
	}
	rstop()
	if err := <-rerr; err != nil && runErr == nil {
		runErr = fmt.Errorf("runner: %w", err)
	}
	res.d = time.Since(res.start)
	jstop()
	wg.Wait()
	if runErr != nil {
		return runErr
	}
	var walBytes float64
	if err := b.admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)`, lsn0).Scan(&walBytes); err != nil {
		return err
	}
	res.wal = int64(walBytes)
	st := runner.Stats()
	if st.DeadLettered > 0 || st.Retried > 0 || st.Duplicates > 0 {
		return fmt.Errorf("%d dead-lettered, %d retried, %d duplicates: every key is new", st.DeadLettered, st.Retried, st.Duplicates)
	}
	res.claims = src.Acked.Load()
	res.claimLat, res.commitLat = tracer.TakeSamples()
	if res.after, err = pgload.Sizes(ctx, b.admin, table); err != nil {
		return err
	}
	claims := pgload.Durations(res.claimLat)
	fmt.Printf("  run: %d claims in %.1f s = %.0f claims/s; claim p50 %s, p99 %s, max %s; commit p99 %s; WAL %.0f bytes per claim\n",
		res.claims, res.d.Seconds(), res.rate(), pgload.Ms(pgload.Pct(claims, 0.5)), pgload.Ms(pgload.Pct(claims, 0.99)),
		pgload.Ms(pgload.Pct(claims, 1)), pgload.Ms(pgload.Pct(pgload.Durations(res.commitLat), 0.99)), walBytes/float64(max(res.claims, 1)))
	for k, c := range res.cycles {
		if c.done.IsZero() {
			fmt.Printf("  rollover %d at %+.0f s: its day not gone by the end of the run\n", k+1, c.at.Sub(res.start).Seconds())
			continue
		}
		w := window(res.claimLat, c.started, c.done)
		fmt.Printf("  rollover %d at %+.0f s: its day removed in %.3f s (from the janitor's first transaction after it; %.1f s after the rollover); claims meanwhile: p99 %s, max %s\n",
			k+1, c.at.Sub(res.start).Seconds(), c.done.Sub(c.started).Seconds(), c.done.Sub(c.at).Seconds(), pgload.Ms(pgload.Pct(w, 0.99)), pgload.Ms(pgload.Pct(w, 1)))
	}
	if n := len(res.janitorErrs); n > 0 {
		fmt.Printf("  %d cleanups failed (and were retried a second later), the first: %s\n", n, res.janitorErrs[0])
	}
	fmt.Printf("  after the run: heap %s, indexes %s, %d live and %d dead tuples, %d vacuums\n",
		pgload.MiB(res.after.Table), pgload.MiB(res.after.Indexes), res.after.Live, res.after.Dead, res.after.Vacuums)
	return nil
}

// window returns the latencies of the samples that ended in [from, to].
func window(ss []pgload.Sample, from, to time.Time) []time.Duration {
	var out []time.Duration
	for _, s := range ss {
		if !s.End.Before(from) && !s.End.After(to) {
			out = append(out, s.D)
		}
	}
	return out
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// countingDB is the janitor's database: it reports when a transaction
// begins and, at each commit, the rows its DELETEs removed and the tables
// it dropped so far.
type countingDB struct {
	*pgxpool.Pool
	deleted, drops atomic.Int64
	began          func(at time.Time)
	committed      func(deleted, drops int64, at time.Time)
}

// Begin starts a counting transaction.
func (d *countingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	d.began(time.Now())
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &countingTx{Tx: tx, db: d}, nil
}

type countingTx struct {
	pgx.Tx
	db             *countingDB
	deleted, drops int64
}

func (t *countingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := t.Tx.Exec(ctx, sql, args...)
	if err == nil {
		switch {
		case tag.Delete():
			t.deleted += tag.RowsAffected()
		case tag.String() == "DROP TABLE":
			t.drops++
		}
	}
	return tag, err
}

func (t *countingTx) Commit(ctx context.Context) error {
	if err := t.Tx.Commit(ctx); err != nil {
		return err
	}
	if t.deleted > 0 || t.drops > 0 {
		t.db.committed(t.db.deleted.Add(t.deleted), t.db.drops.Add(t.drops), time.Now())
	}
	return nil
}
