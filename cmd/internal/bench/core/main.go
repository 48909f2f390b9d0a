// Command core measures the transactional path on a real PostgreSQL against
// hand-written workers that do the same database work, all rows in one run,
// with the same tables and the same business mutation (one UPDATE of an
// accounts row per message), at the same concurrency:
//
//   - careful worker: per message BEGIN; INSERT record ON CONFLICT DO
//     NOTHING; UPDATE accounts (if the record was new); COMMIT;
//   - set-based worker: per 100 messages BEGIN; INSERT records SELECT
//     unnest(…) ON CONFLICT DO NOTHING RETURNING key; the UPDATEs of the new
//     keys pipelined in one pgx.Batch; COMMIT;
//   - idemq at batch size 1 and 100 with a per-message TxJSON handler, idemq
//     at batch size 100 with the batch API (TransactionalBatch, the same
//     pipelined UPDATEs), the same with the otelidemq hook on the
//     OpenTelemetry SDK (every span sampled, exported to a no-op exporter
//     through a batch span processor; metrics into a ManualReader), with a
//     span per message and with a span per transaction
//     (otelidemq.Config.SpanPerTransaction), and idemq re-reading messages
//     already processed (all duplicates).
//
// Every row runs until it has handled at least -n messages and for at least
// -min (defaults 20,000 and 5 s). The rows run in two rounds, the second in
// the reverse order, and the ratios are taken within a round. A pgx tracer
// counts round trips (a query, an Exec, a batch) and statements per message;
// txid_current() before and after a row gives the transaction IDs per
// message (cluster-wide: other clients of the same server add to it). The
// messages come from an in-process source (no broker). Run it with `make
// bench`; TEST_DATABASE_URL selects the server.
//
// The idemq rows include the default config (Config.BatchSize left 0). Three
// modes measure where batching can cost:
//
//   - -contention: messages carry no partition key and update an account
//     picked by a hash of their key, so that concurrent lanes lock the same
//     rows in crossing orders; every idemq row prints its retries, split
//     into infrastructure retries (deadlocks: SQLSTATE 40P01) and counted
//     attempts. The set-based worker updates in account order.
//   - -poison N: the handler of every N-th message fails with a Permanent
//     error (dead-lettered at once), so that its batch rolls back and reruns
//     without it. Run it with -rows on the idemq rows: the hand-written
//     workers have no dead-letter route.
//   - -rate R: the source hands out messages at R per second, and every
//     idemq row prints the p50 and p99 of receipt-to-ack (Message.ReceivedAt
//     to the end of the Ack call).
//
// Every row also prints the client's CPU time and allocations per message
// (the whole bench process; PostgreSQL runs in its own).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemq/idemq/cmd/internal/bench/handwritten"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/pgtrace"
)

const schema = "idemq_bench"

type order struct {
	Account int32 `json:"account"`
	Amount  int64 `json:"amount"`
}

type options struct {
	dsn         string
	n           int
	min         time.Duration
	concurrency int
	accounts    int
	sweep       bool
	rows        string
	rounds      int
	contention  bool
	sweepSizes  string
	sweepAPI    string
	poison      int
	rate        int
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", "", "PostgreSQL URL (default: $TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable)")
	flag.IntVar(&o.n, "n", 20000, "least messages per row")
	flag.DurationVar(&o.min, "min", 5*time.Second, "least duration per row")
	flag.IntVar(&o.concurrency, "concurrency", 4, "workers (hand-written) and Runner.Concurrency (idemq)")
	flag.IntVar(&o.accounts, "accounts", 1000, "rows in the accounts table")
	flag.BoolVar(&o.sweep, "sweep", false, "after the rounds, run idemq at batch sizes 10 to 1000")
	flag.StringVar(&o.rows, "rows", "", "run only the rows whose name matches this regular expression")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds (every other one in reverse order)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.StringVar(&o.sweepSizes, "sweep-sizes", "10,50,100,200,500,1000", "batch sizes of -sweep")
	flag.StringVar(&o.sweepAPI, "sweep-api", "both", "handlers of -sweep: handler (per-message), api (batch API) or both")
	flag.BoolVar(&o.contention, "contention", false, "no partition keys: accounts by a hash of the key, lanes contend for rows")
	flag.IntVar(&o.poison, "poison", 0, "the handler of every N-th message fails permanently (idemq rows only)")
	flag.IntVar(&o.rate, "rate", 0, "hand out messages at this many per second and print receipt-to-ack latency (0: as fast as taken)")
	flag.Parse()
	if o.dsn == "" {
		o.dsn = envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable")
	}
	stopProfile, err := handwritten.StartCPUProfile(*cpuprofile)
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

// result is one row's measurement.
type result struct {
	name         string
	n            int64
	d            time.Duration
	trips, stmts int64
	xids         int64
	cpu          time.Duration // client CPU per message
	allocs       float64       // client allocations per message
}

func (r result) rate() float64       { return float64(r.n) / r.d.Seconds() }
func (r result) per(v int64) float64 { return float64(v) / float64(r.n) }

// row is one workload. It processes messages from gen until gen stops and
// returns how many it applied (new) and handled in all.
type row struct {
	name  string
	scope string
	base  string // the name of the hand-written row it is compared with
	dup   bool   // replays the keys of the other row with the same scope
	run   func(ctx context.Context, pool *pgxpool.Pool, store *pgdedup.Store, gen *generator) error
}

type bench struct {
	o      options
	admin  *pgxpool.Pool
	logger *slog.Logger
	keys   map[string][]string // keys handled per scope, for the duplicate row
	mu     sync.Mutex
	expect int64
}

func run(ctx context.Context, o options) error {
	admin, err := pgxpool.New(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	setup := []string{
		`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`,
		`CREATE SCHEMA ` + schema,
		`CREATE TABLE ` + schema + `.accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`,
		fmt.Sprintf(`INSERT INTO %s.accounts (id) SELECT generate_series(0, %d)`, schema, o.accounts-1),
	}
	for _, sql := range setup {
		if _, err := admin.Exec(ctx, sql); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	defer admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	store, err := pgdedup.New(admin, pgdedup.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	var syncCommit string
	_ = admin.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&syncCommit)
	fmt.Printf("PostgreSQL path benchmark: concurrency %d, %d accounts, synchronous_commit=%s, each row >= %d messages and >= %s\n",
		o.concurrency, o.accounts, syncCommit, o.n, o.min)
	fmt.Printf("round trips and statements from a pgx tracer; XIDs from txid_current() before and after a row (cluster-wide)\n")

	b := &bench{o: o, admin: admin, keys: map[string][]string{},
		logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	rows := []row{
		{name: "careful worker (BEGIN; INSERT; UPDATE; COMMIT)", scope: "careful", run: b.careful},
		{name: "idemq, default config", scope: "dflt", base: "careful worker (BEGIN; INSERT; UPDATE; COMMIT)", run: b.idemq(0, false, noHook)},
		{name: "idemq, batch 1", scope: "b1", base: "careful worker (BEGIN; INSERT; UPDATE; COMMIT)", run: b.idemq(1, false, noHook)},
		{name: "set-based worker (100 per tx, unnest + pgx.Batch)", scope: "setbased", run: b.setBased(100)},
		{name: "idemq, batch 100, per-message handler", scope: "b100", base: "set-based worker (100 per tx, unnest + pgx.Batch)", run: b.idemq(100, false, noHook)},
		{name: "idemq, batch 100, batch API", scope: "api100", base: "set-based worker (100 per tx, unnest + pgx.Batch)", run: b.idemq(100, true, noHook)},
		{name: "idemq, batch 100, batch API, OTel SDK", scope: "otel100", base: "idemq, batch 100, batch API", run: b.idemq(100, true, otelPerMessage)},
		{name: "idemq, batch 100, batch API, OTel SDK, tx spans", scope: "oteltx100", base: "idemq, batch 100, batch API", run: b.idemq(100, true, otelPerTransaction)},
		{name: "idemq, batch 100, all duplicates", scope: "api100", dup: true, run: b.idemq(100, true, noHook)},
	}
	if o.rows != "" {
		re, err := regexp.Compile(o.rows)
		if err != nil {
			return fmt.Errorf("-rows: %w", err)
		}
		rows = slices.DeleteFunc(rows, func(r row) bool { return !re.MatchString(r.name) })
	}
	for round := 1; round <= o.rounds; round++ {
		order := rows
		if round%2 == 0 && len(rows) > 1 {
			order = make([]row, len(rows))
			for i, r := range rows {
				order[len(rows)-1-i] = r
			}
			// The duplicates replay the keys of the row with their scope:
			// keep them after it.
			for i, r := range order {
				if !r.dup {
					continue
				}
				src := slices.IndexFunc(order, func(o row) bool { return !o.dup && o.scope == r.scope })
				if src > i {
					order = slices.Insert(slices.Delete(order, i, i+1), src, r)
				}
				break
			}
		}
		results := map[string]result{}
		fmt.Printf("\nround %d\n%-52s %8s %7s %9s %8s %9s %9s %8s %9s %7s\n", round, "workload", "messages", "seconds", "msg/s", "ratio", "trips/msg", "stmts/msg", "XIDs/msg", "CPU/msg", "allocs/msg")
		for _, r := range order {
			res, err := b.measure(ctx, r, round)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, r.name, err)
			}
			results[r.name] = res
			ratio := "-"
			if base, ok := results[r.base]; ok {
				ratio = fmt.Sprintf("%.2fx", res.rate()/base.rate())
			}
			fmt.Printf("%-52s %8d %7.2f %9.0f %8s %9.3f %9.3f %8.3f %7.1fµs %7.1f\n", r.name, res.n, res.d.Seconds(), res.rate(), ratio,
				res.per(res.trips), res.per(res.stmts), res.per(res.xids), float64(res.cpu)/float64(time.Microsecond), res.allocs)
		}
		// Ratios against a baseline that ran later in the round.
		for _, r := range order {
			if r.base == "" {
				continue
			}
			res, base := results[r.name], results[r.base]
			if base.n == 0 {
				continue // the baseline was not run (-rows)
			}
			fmt.Printf("  %s vs %s: %.2fx\n", r.name, r.base, res.rate()/base.rate())
		}
	}
	if o.sweep {
		fmt.Printf("\nbatch size sweep (idemq, msg/s, round trips and XIDs per message)\n")
		apis := map[string][]bool{"both": {false, true}, "handler": {false}, "api": {true}}[o.sweepAPI]
		if apis == nil {
			return fmt.Errorf("-sweep-api: %q is not handler, api or both", o.sweepAPI)
		}
		var sizes []int
		for _, f := range strings.Split(o.sweepSizes, ",") {
			size, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || size < 1 {
				return fmt.Errorf("-sweep-sizes: bad size %q", f)
			}
			sizes = append(sizes, size)
		}
		for _, api := range apis {
			for _, size := range sizes {
				name := fmt.Sprintf("idemq, batch %d, %s", size, map[bool]string{false: "per-message handler", true: "batch API"}[api])
				res, err := b.measure(ctx, row{name: name, scope: fmt.Sprintf("sweep-%v-%d", api, size), run: b.idemq(size, api, noHook)}, 0)
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				fmt.Printf("%-52s %8d %7.2f %9.0f %9.3f %9.3f %8.3f %7.1fµs %7.1f\n", name, res.n, res.d.Seconds(), res.rate(), res.per(res.trips), res.per(res.stmts), res.per(res.xids),
					float64(res.cpu)/float64(time.Microsecond), res.allocs)
			}
		}
	}

	var total int64
	if err := admin.QueryRow(ctx, `SELECT sum(balance) FROM `+schema+`.accounts`).Scan(&total); err != nil {
		return err
	}
	if total != b.expect {
		return fmt.Errorf("effects: sum of balances %d, want %d", total, b.expect)
	}
	fmt.Printf("\neffects: sum of balances = %d = messages applied once each\n", total)
	return nil
}

// measure runs one row on a fresh, traced pool.
func (b *bench) measure(ctx context.Context, r row, round int) (result, error) {
	cfg, err := pgxpool.ParseConfig(b.o.dsn)
	if err != nil {
		return result{}, err
	}
	c := &pgtrace.Counter{}
	cfg.ConnConfig.Tracer = c
	cfg.MaxConns = int32(b.o.concurrency + 1)
	cfg.MinConns = cfg.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		return result{}, err
	}
	scope := fmt.Sprintf("%s-r%d", r.scope, round)
	var gen *generator
	if r.dup {
		b.mu.Lock()
		keys := b.keys[scope]
		b.mu.Unlock()
		if len(keys) == 0 {
			return result{}, errors.New("no keys to replay")
		}
		gen = newGenerator(scope, b.o, keys)
	} else {
		gen = newGenerator(scope, b.o, nil)
	}
	// Warm up the pool's connections outside the measurement, and give the
	// planner the statistics of the records written so far, as autovacuum
	// would in a steady state (on a table that grew from empty within
	// seconds, a stale estimate turns the duplicates' lookup into a
	// sequential scan).
	if err := pool.Ping(ctx); err != nil {
		return result{}, err
	}
	if _, err := b.admin.Exec(ctx, `ANALYZE `+schema+`.processed_messages`); err != nil {
		return result{}, err
	}
	var x0, x1 int64
	if err := b.admin.QueryRow(ctx, `SELECT txid_current()`).Scan(&x0); err != nil {
		return result{}, err
	}
	c.Trips.Store(0)
	c.Statements.Store(0)
	usage := handwritten.StartUsage()
	start := time.Now()
	gen.start = start
	if err := r.run(ctx, pool, store, gen); err != nil {
		return result{}, err
	}
	d := time.Since(start)
	cpu, allocs := usage.Per(gen.count())
	if err := b.admin.QueryRow(ctx, `SELECT txid_current()`).Scan(&x1); err != nil {
		return result{}, err
	}
	if !r.dup {
		b.mu.Lock()
		b.keys[scope] = gen.produced()
		b.expect += int64(len(gen.produced()) - gen.poisoned())
		b.mu.Unlock()
	}
	// txid_current() itself takes one XID: count from x0+1 to x1, excluded.
	return result{name: r.name, n: int64(gen.count()), d: d, trips: c.Trips.Load(), stmts: c.Statements.Load(), xids: x1 - x0 - 1,
		cpu: cpu, allocs: allocs}, nil
}

// generator produces messages until it has made at least n and run for at
// least min, or replays keys (all duplicates) for as long.
type generator struct {
	scope    string
	n        int
	min      time.Duration
	accounts int
	replay   []string
	start    time.Time
	contend  bool
	poison   int
	rate     int

	mu      sync.Mutex
	made    int
	stopped bool
	keys    []string
}

func newGenerator(scope string, o options, replay []string) *generator {
	return &generator{scope: scope, n: o.n, min: o.min, accounts: o.accounts, replay: replay,
		contend: o.contention, poison: o.poison, rate: o.rate}
}

// next returns up to max new messages, or none once the generator stopped.
func (g *generator) next(max int) []*consumer.Message {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return nil
	}
	if g.made >= g.n && time.Since(g.start) >= g.min {
		g.stopped = true
		return nil
	}
	if g.rate > 0 {
		// Paced: only what is due by now.
		max = min(max, int(time.Since(g.start).Seconds()*float64(g.rate))-g.made)
		if max <= 0 {
			return []*consumer.Message{}
		}
	}
	out := make([]*consumer.Message, 0, max)
	for range max {
		i := g.made
		g.made++
		var key string
		if g.replay != nil {
			key = g.replay[i%len(g.replay)]
		} else {
			key = fmt.Sprintf("%s-%d", g.scope, i)
			g.keys = append(g.keys, key)
		}
		out = append(out, message(key, g.accounts, g.contend))
	}
	return out
}

func (g *generator) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.made
}

// poisoned returns how many of the messages made are poison (their
// handler fails).
func (g *generator) poisoned() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.poison <= 0 || g.replay != nil {
		return 0
	}
	return g.made / g.poison
}

// isPoison reports whether the message of key is poison (every poison-th).
func isPoison(key string, poison int) bool {
	return poison > 0 && keyNumber(key)%poison == poison-1
}

func (g *generator) produced() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.keys
}

// keyNumber is the number a key ends in.
func keyNumber(key string) int {
	n, err := strconv.Atoi(key[strings.LastIndexByte(key, '-')+1:])
	if err != nil {
		panic(fmt.Sprintf("bench: key %q does not end in a number", key)) // keys are ours
	}
	return n
}

// message is the message of key: an amount of 1 on the account the key's
// number selects (with contend, a hash of the key). The same key always has
// the same body.
func message(key string, accounts int, contend bool) *consumer.Message {
	acct := keyNumber(key) % accounts
	if contend {
		h := fnv.New32a()
		h.Write([]byte(key))
		acct = int(h.Sum32() % uint32(accounts))
		body, _ := json.Marshal(order{Account: int32(acct), Amount: 1})
		return &consumer.Message{ID: key, Key: key, Body: body, Attempt: 1, ReceivedAt: time.Now()}
	}
	body, _ := json.Marshal(order{Account: int32(acct), Amount: 1})
	// Partitioning by account keeps one account's updates in one lane, so
	// concurrent batches do not lock accounts in crossing orders.
	return &consumer.Message{ID: key, Key: key, Body: body, PartitionKey: fmt.Sprint(acct), Attempt: 1, ReceivedAt: time.Now()}
}

func (b *bench) update() string {
	return `UPDATE ` + schema + `.accounts SET balance = balance + $1 WHERE id = $2`
}

// dispatch feeds the hand-written workers: each partition key (account)
// goes to one worker by the same hash as the runner's lanes, through a
// queue of max messages, and each worker takes what is queued, up to max
// messages at a time.
func (b *bench) dispatch(ctx context.Context, gen *generator, max int, work func(msgs []*consumer.Message) error) error {
	lanes := make([]chan *consumer.Message, b.o.concurrency)
	errc := make(chan error, b.o.concurrency)
	var wg sync.WaitGroup
	for i := range lanes {
		lanes[i] = make(chan *consumer.Message, max)
		wg.Go(func() {
			for m := range lanes[i] {
				batch := []*consumer.Message{m}
			more:
				for len(batch) < max {
					select {
					case m, ok := <-lanes[i]:
						if !ok {
							break more
						}
						batch = append(batch, m)
					default:
						break more
					}
				}
				if err := work(batch); err != nil {
					errc <- err
					for range lanes[i] { //nolint:revive // drain
					}
					return
				}
			}
		})
	}
	for msgs := gen.next(100); msgs != nil && ctx.Err() == nil; msgs = gen.next(100) {
		if len(msgs) == 0 {
			time.Sleep(time.Millisecond) // paced: nothing due yet
			continue
		}
		for _, m := range msgs {
			h := fnv.New32a()
			if m.PartitionKey != "" {
				h.Write([]byte(m.PartitionKey))
			} else {
				h.Write([]byte(m.ID)) // as the runner's lanes
			}
			lanes[h.Sum32()%uint32(len(lanes))] <- m
		}
	}
	for _, l := range lanes {
		close(l)
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return ctx.Err()
	}
}

// careful is the hand-written per-message worker.
func (b *bench) careful(ctx context.Context, pool *pgxpool.Pool, _ *pgdedup.Store, gen *generator) error {
	insert := `INSERT INTO ` + schema + `.processed_messages (scope, key, payload_hash, expires_at)
VALUES ($1, $2, $3, now() + interval '72 hours') ON CONFLICT (scope, key) DO NOTHING`
	update := b.update()
	return b.dispatch(ctx, gen, 1, func(msgs []*consumer.Message) error {
		m := msgs[0]
		var o order
		if err := json.Unmarshal(m.Body, &o); err != nil {
			return err
		}
		h := dedup.HashPayload(m.Body)
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		tag, err := tx.Exec(ctx, insert, gen.scope, m.ID, h[:])
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			if _, err := tx.Exec(ctx, update, o.Amount, o.Account); err != nil {
				return err
			}
		}
		return tx.Commit(ctx)
	})
}

// setBased is the hand-written batch worker: one set-based insert of the
// records, the UPDATEs of the new keys pipelined, one commit.
func (b *bench) setBased(size int) func(ctx context.Context, pool *pgxpool.Pool, _ *pgdedup.Store, gen *generator) error {
	return func(ctx context.Context, pool *pgxpool.Pool, _ *pgdedup.Store, gen *generator) error {
		insert := `INSERT INTO ` + schema + `.processed_messages (scope, key, payload_hash, expires_at)
SELECT $1, u.k, u.h, now() + interval '72 hours' FROM unnest($2::text[], $3::bytea[]) AS u(k, h)
ORDER BY u.k ON CONFLICT (scope, key) DO NOTHING RETURNING key`
		update := b.update()
		return b.dispatch(ctx, gen, size, func(msgs []*consumer.Message) error {
			keys, hashes := make([]string, len(msgs)), make([][]byte, len(msgs))
			orders := make(map[string]order, len(msgs))
			for i, m := range msgs {
				var o order
				if err := json.Unmarshal(m.Body, &o); err != nil {
					return err
				}
				h := dedup.HashPayload(m.Body)
				keys[i], hashes[i], orders[m.ID] = m.ID, h[:], o
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			rows, err := tx.Query(ctx, insert, gen.scope, keys, hashes)
			if err != nil {
				return err
			}
			fresh, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			if len(fresh) > 0 {
				// In account order, so that concurrent batches never lock
				// accounts in crossing orders.
				slices.SortFunc(fresh, func(a, b string) int { return int(orders[a].Account - orders[b].Account) })
				batch := &pgx.Batch{}
				for _, k := range fresh {
					o := orders[k]
					batch.Queue(update, o.Amount, o.Account)
				}
				if err := tx.SendBatch(ctx, batch).Close(); err != nil {
					return err
				}
			}
			return tx.Commit(ctx)
		})
	}
}

// hook selects the hook of an idemq row.
type hook int

const (
	noHook             hook = iota
	otelPerMessage          // otelidemq on the SDK, a span per message
	otelPerTransaction      // otelidemq on the SDK, SpanPerTransaction
)

// idemq runs a Runner at batch size size, with the per-message TxJSON
// handler or the batch API doing the same UPDATEs in one pipelined batch,
// and with the otelidemq hook on SDK providers unless h is noHook.
func (b *bench) idemq(size int, api bool, h hook) func(ctx context.Context, pool *pgxpool.Pool, store *pgdedup.Store, gen *generator) error {
	return func(ctx context.Context, pool *pgxpool.Pool, store *pgdedup.Store, gen *generator) error {
		update := b.update()
		rc := &retryCount{}
		var path consumer.Path
		if api {
			path = consumer.TransactionalBatch(store, consumer.TxBatchJSON(func(ctx context.Context, tx pgx.Tx, items []consumer.BatchItem[order]) error {
				batch := &pgx.Batch{}
				for _, it := range items {
					if isPoison(it.Msg.Key, gen.poison) {
						return &consumer.MessageError{Msg: it.Msg, Err: consumer.Permanent(errPoison)}
					}
					batch.Queue(update, it.Value.Amount, it.Value.Account)
				}
				return rc.seen(tx.SendBatch(ctx, batch).Close())
			}))
		} else {
			path = consumer.Transactional(store, consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, o order) error {
				if isPoison(m.Key, gen.poison) {
					return consumer.Permanent(errPoison)
				}
				_, err := tx.Exec(ctx, update, o.Amount, o.Account)
				return rc.seen(err)
			}))
		}
		lat := &handwritten.Latency{}
		var hooks []consumer.Hook // none unless a mode needs them: hooks are measured by their own rows
		if gen.contend {
			hooks = append(hooks, rc)
		}
		if gen.rate > 0 {
			hooks = append(hooks, lat)
		}
		if h != noHook {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			defer func() { _ = tp.Shutdown(context.WithoutCancel(ctx)); _ = mp.Shutdown(context.WithoutCancel(ctx)) }()
			oh, err := otelidemq.New(otelidemq.Config{ConsumerGroup: gen.scope, TracerProvider: tp, MeterProvider: mp,
				SpanPerTransaction: h == otelPerTransaction})
			if err != nil {
				return err
			}
			hooks = append(hooks, oh)
		}
		src := &genSource{gen: gen, done: make(chan struct{})}
		runner, err := consumer.NewRunner(src, path, consumer.Config{
			Name: gen.scope, Concurrency: b.o.concurrency, BatchSize: size, Logger: b.logger, Hooks: hooks,
		})
		if err != nil {
			return err
		}
		if err := src.drain(ctx, runner); err != nil {
			return err
		}
		st := runner.Stats()
		if want := uint64(gen.poisoned()); st.DeadLettered != want {
			return fmt.Errorf("%d dead-lettered, want %d", st.DeadLettered, want)
		}
		if st.Retried > 0 && !gen.contend {
			return fmt.Errorf("%d retried", st.Retried)
		}
		if gen.contend {
			fmt.Printf("    retries: %d infrastructure (%d of them deadlocks, 40P01), %d counted attempts; %d dead-lettered;"+
				" handlers saw %d deadlocks or serialization failures\n",
				rc.infra.Load(), rc.deadlocks.Load(), rc.counted.Load(), st.DeadLettered, rc.handlers.Load())
		}
		if gen.rate > 0 {
			fmt.Printf("    at %d msg/s: %s\n", gen.rate, lat)
		}
		if gen.replay != nil && st.Duplicates != uint64(gen.count()) {
			return fmt.Errorf("%d duplicates, want %d", st.Duplicates, gen.count())
		}
		return nil
	}
}

var errPoison = errors.New("poison message")

// retryCount counts the runner's retries by kind, and the deadlocks among
// them; handlers counts the deadlocks and serialization failures the
// handlers' statements got, whether or not the runner retried them through
// the source (a rerun in the same delivery is not a retry).
type retryCount struct{ infra, deadlocks, counted, handlers atomic.Int64 }

// seen counts err if it is a deadlock or a serialization failure, and
// returns it.
func (c *retryCount) seen(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001") {
		c.handlers.Add(1)
	}
	return err
}

func (c *retryCount) OnRetry(_ context.Context, _ *consumer.Message, kind consumer.RetryKind, _ time.Duration, err error) {
	if kind == consumer.RetryInfrastructure {
		c.infra.Add(1)
	} else {
		c.counted.Add(1)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
		c.deadlocks.Add(1)
	}
}

// genSource serves a generator's messages and counts settlements.
type genSource struct {
	gen     *generator
	mu      sync.Mutex
	retried []*consumer.Message
	settled int
	done    chan struct{}
	closed  bool
}

func (s *genSource) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	for {
		s.mu.Lock()
		if n := min(max, len(s.retried)); n > 0 {
			out := s.retried[:n:n]
			s.retried = s.retried[n:]
			s.mu.Unlock()
			return out, nil
		}
		s.mu.Unlock()
		if msgs := s.gen.next(max); len(msgs) > 0 {
			return msgs, nil
		}
		s.check()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond): // retried messages come back later
		}
	}
}

// check closes done once the generator stopped and everything it made is
// settled.
func (s *genSource) check() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen.mu.Lock()
	stopped, made := s.gen.stopped, s.gen.made
	s.gen.mu.Unlock()
	if stopped && s.settled == made && !s.closed {
		s.closed = true
		close(s.done)
	}
}

func (s *genSource) settle(n int) {
	s.mu.Lock()
	s.settled += n
	s.mu.Unlock()
	s.check()
}

func (s *genSource) Ack(_ context.Context, msgs []*consumer.Message) error {
	s.settle(len(msgs))
	return nil
}

func (s *genSource) Retry(_ context.Context, m *consumer.Message, delay time.Duration) error {
	time.AfterFunc(delay, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		m.Attempt++
		s.retried = append(s.retried, m)
	})
	return nil
}

func (s *genSource) DeadLetter(context.Context, *consumer.Message, error) error {
	s.settle(1)
	return nil
}

func (s *genSource) Close() error { return nil }

// drain runs runner until every message is settled.
func (s *genSource) drain(ctx context.Context, runner *consumer.Runner) error {
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- runner.Run(rctx) }()
	select {
	case <-s.done:
	case err := <-errc:
		return fmt.Errorf("runner stopped early: %w", err)
	case <-ctx.Done():
		return errors.New("timed out")
	}
	stop()
	return <-errc
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
