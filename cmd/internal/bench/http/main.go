// Command http measures an Idempotency-Key endpoint on idemq
// (sources/httpsource on the transactional path, pgdedup and pgx) against a
// careful hand-written net/http + pgx handler doing the same transaction,
// both behind a real net/http server on 127.0.0.1 and driven by the same
// HTTP clients:
//
//   - hand-written: per request BEGIN; INSERT the key with the payload
//     digest ON CONFLICT DO NOTHING RETURNING (a conflict reads the stored
//     response and replays it, or answers 422); UPDATE the balance
//     RETURNING it; INSERT the charge RETURNING its id; UPDATE the key's row
//     with the response; COMMIT; write the response;
//   - idemq: httpsource.Tx with the same UPDATE and INSERT, the response
//     stored with the key's record by the runner; concurrent requests share
//     a transaction and its commit (Config.BatchSize);
//   - idemq-batch: the batch API (consumer.TransactionalBatch) over the
//     requests a lane takes at once: the accounts locked in id order, one
//     set-based UPDATE of the balances and one INSERT of the charges, in one
//     pipelined round trip, and each request's response set with
//     httpsource.Respond.
//
// Every request carries a new key and charges one of -accounts accounts at
// random. Each row runs -clients concurrent clients (1, 16 and 64) for
// -duration, in two rounds, the second in the reverse order, and prints
// requests/s, p50 and p99 latency, the database round trips per request
// (counted by a pgx tracer on the endpoint's pool: a query, an Exec or a
// pipelined batch is one) and the ratios idemq / hand-written of the same
// round, with the CPU time and the heap allocations per request of this
// process (the server and the clients together) and the CPU time per
// request of the endpoint's PostgreSQL backends (read from /proc when the
// server runs on this machine). -only runs one endpoint,
// -cpuprofile profiles the measured rows. Run it with `make bench-http`; TEST_DATABASE_URL selects the
// server.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/cmd/internal/bench/handwritten"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/pgtrace"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/sources/httpsource"
)

const schema = "idemq_bench_http"

type charge struct {
	ID      int64 `json:"id,omitempty"`
	Account int64 `json:"account"`
	Amount  int64 `json:"amount"`
	Balance int64 `json:"balance"`
}

func main() {
	dsn := flag.String("dsn", "", "PostgreSQL URL (default: $TEST_DATABASE_URL)")
	duration := flag.Duration("duration", 5*time.Second, "how long each row runs")
	clientsFlag := flag.String("clients", "1,16,64", "concurrent clients of each row")
	accounts := flag.Int("accounts", 1000, "accounts the charges spread over")
	rounds := flag.Int("rounds", 2, "rounds, alternating the order")
	concurrency := flag.Int("concurrency", 4, "the idemq runners' Config.Concurrency (lanes): fewer lanes make larger batches")
	only := flag.String("only", "", "run only the endpoint of this name (hand-written, idemq or idemq-batch)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the measured rows to this file")
	flag.Parse()
	if *dsn == "" {
		*dsn = os.Getenv("TEST_DATABASE_URL")
	}
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "bench http: set -dsn or TEST_DATABASE_URL")
		os.Exit(2)
	}
	var clients []int
	for _, s := range strings.Split(*clientsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench http: bad -clients %q\n", *clientsFlag)
			os.Exit(2)
		}
		clients = append(clients, n)
	}
	if *only != "" && *only != "idemq" && *only != "idemq-batch" && *only != "hand-written" {
		fmt.Fprintf(os.Stderr, "bench http: bad -only %q (hand-written, idemq or idemq-batch)\n", *only)
		os.Exit(2)
	}
	if err := run(context.Background(), *dsn, clients, *duration, *accounts, *rounds, *concurrency, *only, *cpuprofile); err != nil {
		fmt.Fprintln(os.Stderr, "bench http:", err)
		os.Exit(1)
	}
}

// server is one endpoint under test.
type server struct {
	name  string
	url   string
	trips *counter // the round trips of its pool
}

// result is one row of one round.
type result struct {
	reqs     int
	rps      float64
	p50, p99 time.Duration
	errors   int
	trips    int64         // database round trips during the row
	cpu      time.Duration // CPU time of this process (server and clients) per request
	allocs   float64       // heap allocations of this process per request
	dbCPU    time.Duration // CPU time of the pool's server backends per request
}

// counter counts a pool's round trips (pgtrace.Counter, its tracer) and
// keeps the process ids of its server backends, for their CPU time.
type counter struct {
	pgtrace.Counter
	mu   sync.Mutex
	pids []uint32
}

// afterConnect is the pool's AfterConnect: it records the backend's pid.
func (c *counter) afterConnect(_ context.Context, conn *pgx.Conn) error {
	c.mu.Lock()
	c.pids = append(c.pids, conn.PgConn().PID())
	c.mu.Unlock()
	return nil
}

// backendCPU is the CPU time the pool's backends used so far, read from
// /proc (the server must run on this machine; ok is false otherwise). A
// backend that exited is not counted.
func (c *counter) backendCPU() (d time.Duration, ok bool) {
	c.mu.Lock()
	pids := slices.Clone(c.pids)
	c.mu.Unlock()
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis; utime and
		// stime are the 14th and 15th of the line, in clock ticks
		// (USER_HZ, 100 on Linux).
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			continue
		}
		ut, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		d += time.Duration(ut+st) * 10 * time.Millisecond
		ok = true
	}
	return d, ok
}

func run(ctx context.Context, dsn string, clients []int, d time.Duration, accounts, rounds, concurrency int, only, cpuprofile string) error {
	maxClients := slices.Max(clients)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := setup(ctx, pool, accounts); err != nil {
		return err
	}
	defer func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) }()

	hand, stopHand, err := startHand(ctx, dsn, maxClients)
	if err != nil {
		return err
	}
	defer stopHand()
	idem, stopIdem, err := startIdemq(ctx, dsn, concurrency, false)
	if err != nil {
		return err
	}
	defer stopIdem()
	idemBatch, stopIdemBatch, err := startIdemq(ctx, dsn, concurrency, true)
	if err != nil {
		return err
	}
	defer stopIdemBatch()

	tr := &http.Transport{MaxIdleConns: 4 * maxClients, MaxIdleConnsPerHost: 2 * maxClients, IdleConnTimeout: time.Minute}
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	// Warm both up: connections, prepared statements, the JIT of nothing.
	for _, s := range []server{hand, idem, idemBatch} {
		drive(client, s, 4, 500*time.Millisecond, accounts)
	}

	stopProfile, err := handwritten.StartCPUProfile(cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()

	fmt.Printf("POST /charges with a new Idempotency-Key each, %d accounts, %s per row, idemq runners with %d lanes, PostgreSQL at %s\n",
		accounts, d, concurrency, redact.String(dsn))
	fmt.Printf("cpu/req and allocs/req count this whole process (the server and the HTTP clients);\n")
	fmt.Printf("db cpu/req the endpoint's PostgreSQL backends (from /proc, if the server is local)\n\n")
	fmt.Printf("%-5s %-7s %-13s %10s %9s %9s %7s %9s %8s %10s %10s\n", "round", "clients", "endpoint", "req/s", "p50", "p99", "errors", "trips/req", "cpu/req", "allocs/req", "db cpu/req")
	type key struct {
		round, clients int
		name           string
	}
	res := map[key]result{}
	for round := range rounds {
		order := slices.Clone(clients)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, c := range order {
			servers := []server{hand, idem, idemBatch}
			if round%2 == 1 {
				slices.Reverse(servers)
			}
			for _, s := range servers {
				if only != "" && s.name != only {
					continue
				}
				r := drive(client, s, c, d, accounts)
				res[key{round, c, s.name}] = r
				fmt.Printf("%-5d %-7d %-13s %10.0f %9s %9s %7d %9.2f %8s %10.0f %10s\n", round+1, c, s.name, r.rps, r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.errors,
					float64(r.trips)/float64(max(r.reqs, 1)), r.cpu.Round(time.Microsecond), r.allocs, r.dbCPU.Round(time.Microsecond))
			}
		}
	}
	if only != "" {
		return nil
	}
	fmt.Printf("\nratios to hand-written, per round (throughput: higher is better; p50: lower is better)\n")
	fmt.Printf("%-12s %-7s %-5s %12s %8s %8s\n", "endpoint", "clients", "round", "throughput", "p50", "p99")
	for _, s := range []server{idem, idemBatch} {
		for _, c := range clients {
			for round := range rounds {
				h, i := res[key{round, c, hand.name}], res[key{round, c, s.name}]
				fmt.Printf("%-12s %-7d %-5d %11.2fx %7.2fx %7.2fx\n", s.name, c, round+1, i.rps/h.rps, float64(i.p50)/float64(h.p50), float64(i.p99)/float64(h.p99))
			}
		}
	}
	return nil
}

// drive runs n clients against s for d, each posting charges with new keys
// one after another, and measures them.
func drive(client *http.Client, s server, n int, d time.Duration, accounts int) result {
	var (
		mu        sync.Mutex
		latencies []time.Duration
		errs      atomic.Int64
		seq       atomic.Int64
		wg        sync.WaitGroup
	)
	prefix := fmt.Sprintf("%s-%d-", s.name, time.Now().UnixNano())
	trips0 := s.trips.Trips.Load()
	db0, _ := s.trips.backendCPU()
	usage := handwritten.StartUsage()
	start := time.Now()
	end := start.Add(d)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(end) {
				key := prefix + strconv.FormatInt(seq.Add(1), 10)
				body := fmt.Sprintf(`{"account":%d,"amount":%d}`, 1+rand.IntN(accounts), 1+rand.IntN(100))
				t0 := time.Now()
				if err := post(client, s.url, key, body); err != nil {
					errs.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(latencies)
	r := result{reqs: len(latencies), errors: int(errs.Load()), trips: s.trips.Trips.Load() - trips0}
	r.cpu, r.allocs = usage.Per(len(latencies))
	if db1, ok := s.trips.backendCPU(); ok && len(latencies) > 0 {
		r.dbCPU = (db1 - db0) / time.Duration(len(latencies))
	}
	if len(latencies) > 0 {
		r.rps = float64(len(latencies)) / elapsed.Seconds()
		r.p50 = latencies[len(latencies)/2]
		r.p99 = latencies[min(len(latencies)-1, len(latencies)*99/100)]
	}
	return r
}

func post(client *http.Client, url, key, body string) error {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func setup(ctx context.Context, pool *pgxpool.Pool, accounts int) error {
	for _, sql := range []string{
		`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`,
		`CREATE SCHEMA ` + schema,
		`CREATE TABLE ` + schema + `.accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)`,
		`INSERT INTO ` + schema + `.accounts SELECT g, 0 FROM generate_series(1, ` + strconv.Itoa(accounts) + `) g`,
		`CREATE TABLE ` + schema + `.charges (id bigserial PRIMARY KEY, account bigint NOT NULL, amount bigint NOT NULL)`,
		`CREATE TABLE ` + schema + `.hand_keys (key text PRIMARY KEY, payload_hash bytea NOT NULL, response bytea)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	return nil
}

// listen serves h on 127.0.0.1:0 and returns its URL and a stop function.
func listen(h http.Handler) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String() + "/charges", func() { _ = srv.Close() }, nil
}

// chargeTx is the business transaction both endpoints run: the balance and
// the charge.
func chargeTx(ctx context.Context, tx pgx.Tx, c *charge) error {
	if err := tx.QueryRow(ctx, `UPDATE `+schema+`.accounts SET balance = balance + $2 WHERE id = $1 RETURNING balance`,
		c.Account, c.Amount).Scan(&c.Balance); err != nil {
		return err
	}
	return tx.QueryRow(ctx, `INSERT INTO `+schema+`.charges (account, amount) VALUES ($1, $2) RETURNING id`,
		c.Account, c.Amount).Scan(&c.ID)
}

// chargeBatch is the business transaction of the idemq-batch endpoint over
// the charges of a batch, in one pipelined round trip: the accounts locked
// in id order (concurrent batches touch them in one order, so they do not
// deadlock), the balances updated by their sums, the charges inserted. Each
// charge gets its id and the balance after it, as chargeTx gives it.
func chargeBatch(ctx context.Context, tx pgx.Tx, cs []charge) error {
	accts, amounts := make([]int64, len(cs)), make([]int64, len(cs))
	for i, c := range cs {
		accts[i], amounts[i] = c.Account, c.Amount
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT id FROM `+schema+`.accounts WHERE id = ANY($1) ORDER BY id FOR UPDATE`, accts)
	b.Queue(`UPDATE `+schema+`.accounts a SET balance = a.balance + d.total
		FROM (SELECT id, sum(amount) AS total FROM unnest($1::bigint[], $2::bigint[]) AS t(id, amount) GROUP BY id) d
		WHERE a.id = d.id RETURNING a.id, a.balance`, accts, amounts)
	b.Queue(`WITH ins AS (INSERT INTO `+schema+`.charges (account, amount) SELECT * FROM unnest($1::bigint[], $2::bigint[]) RETURNING id)
		SELECT id FROM ins ORDER BY id`, accts, amounts)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return err
	}
	final := make(map[int64]int64, len(cs))
	rows, _ := br.Query()
	var id, balance int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &balance}, func() error { final[id] = balance; return nil }); err != nil {
		return err
	}
	rows, _ = br.Query()
	i := 0
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		if i < len(cs) {
			cs[i].ID = id
		}
		i++
		return nil
	}); err != nil {
		return err
	}
	if i != len(cs) {
		return fmt.Errorf("inserted %d charges for %d", i, len(cs))
	}
	// The balance after each charge: the final one less the amounts of
	// the account's later charges in the batch.
	later := make(map[int64]int64, len(cs))
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i].Balance = final[cs[i].Account] - later[cs[i].Account]
		later[cs[i].Account] += cs[i].Amount
	}
	return br.Close()
}

// countedPool opens an endpoint's pool of maxConns connections, with a
// counter of its round trips and its backends.
func countedPool(ctx context.Context, dsn string, maxConns int) (*pgxpool.Pool, *counter, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = int32(maxConns)
	trips := &counter{}
	cfg.ConnConfig.Tracer = trips
	cfg.AfterConnect = trips.afterConnect
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return pool, trips, nil
}

// startIdemq starts the idemq endpoint: httpsource.Tx per request, or with
// batch the batch API.
func startIdemq(ctx context.Context, dsn string, concurrency int, batch bool) (server, func(), error) {
	pool, trips, err := countedPool(ctx, dsn, concurrency+2)
	if err != nil {
		return server{}, nil, err
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		pool.Close()
		return server{}, nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		pool.Close()
		return server{}, nil, err
	}
	src, err := httpsource.New(httpsource.Config{UnsafeSharedKeySpace: true}) // one client: the bench
	if err != nil {
		pool.Close()
		return server{}, nil, err
	}
	h := httpsource.Tx(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) (httpsource.Response, error) {
		var c charge
		if err := json.Unmarshal(msg.Body, &c); err != nil {
			return httpsource.Response{}, httpsource.Reject(http.StatusBadRequest, err.Error())
		}
		if err := chargeTx(ctx, tx, &c); err != nil {
			return httpsource.Response{}, err
		}
		return httpsource.JSON(http.StatusCreated, c)
	})
	name, path := "idemq", consumer.Transactional[pgx.Tx](store, h)
	if batch {
		name, path = "idemq-batch", consumer.TransactionalBatch[pgx.Tx](store, func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			cs := make([]charge, len(msgs))
			for i, m := range msgs {
				if err := json.Unmarshal(m.Body, &cs[i]); err != nil {
					return &consumer.MessageError{Msg: m, Err: httpsource.Reject(http.StatusBadRequest, err.Error())}
				}
			}
			if err := chargeBatch(ctx, tx, cs); err != nil {
				return err
			}
			for i, m := range msgs {
				res, err := httpsource.JSON(http.StatusCreated, cs[i])
				if err == nil {
					err = httpsource.Respond(m, res)
				}
				if err != nil {
					return &consumer.MessageError{Msg: m, Err: err}
				}
			}
			return nil
		})
	}
	r, err := consumer.NewRunner(src, path,
		consumer.Config{Name: "bench-" + name, Concurrency: concurrency, BatchSize: 64})
	if err != nil {
		pool.Close()
		return server{}, nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	mux := http.NewServeMux()
	mux.Handle("POST /charges", src)
	url, stop, err := listen(mux)
	if err != nil {
		cancel()
		err = errors.Join(err, <-done)
		pool.Close()
		return server{}, nil, err
	}
	return server{name: name, url: url, trips: trips}, func() {
		stop()
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "bench http: idemq runner:", err)
		}
		pool.Close()
	}, nil
}

// startHand starts the hand-written endpoint, with a pool of one connection
// per client (a request holds one for its whole transaction).
func startHand(ctx context.Context, dsn string, clients int) (server, func(), error) {
	pool, trips, err := countedPool(ctx, dsn, clients+2)
	if err != nil {
		return server{}, nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		handCharge(pool, w, r)
	})
	url, stop, err := listen(mux)
	if err != nil {
		pool.Close()
		return server{}, nil, err
	}
	return server{name: "hand-written", url: url, trips: trips}, func() { stop(); pool.Close() }, nil
}

// handCharge is the careful hand-written endpoint: the key, the effect and
// the response in one transaction, the response written after the commit.
func handCharge(pool *pgxpool.Pool, w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var c charge
	if err := json.Unmarshal(body, &c); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	hash := sha256.Sum256(body)
	tx, err := pool.Begin(ctx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // safe after Commit
	var inserted string
	err = tx.QueryRow(ctx, `INSERT INTO `+schema+`.hand_keys (key, payload_hash) VALUES ($1, $2)
ON CONFLICT (key) DO NOTHING RETURNING key`, key, hash[:]).Scan(&inserted)
	if errors.Is(err, pgx.ErrNoRows) {
		var stored, response []byte
		if err := tx.QueryRow(ctx, `SELECT payload_hash, response FROM `+schema+`.hand_keys WHERE key = $1`, key).Scan(&stored, &response); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if string(stored) != string(hash[:]) {
			http.Error(w, "key reused with another payload", http.StatusUnprocessableEntity)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(response)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if err := chargeTx(ctx, tx, &c); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	response, err := json.Marshal(c)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	response = append(response, '\n')
	if _, err := tx.Exec(ctx, `UPDATE `+schema+`.hand_keys SET response = $2 WHERE key = $1`, key, response); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(response)
}
