// Package handwritten is the database half of the hand-written workers the
// broker benchmarks compare idemq against: what a careful user writes by hand
// with pgx for the same effect as an idemq Transactional handler of one
// UPDATE, and the same exactly-once guarantee (a processed-key row in the
// same transaction, the broker acknowledgement after the commit).
//
//   - One: per message BEGIN; INSERT INTO processed … ON CONFLICT DO
//     NOTHING; UPDATE accounts … (only if the key was new); COMMIT.
//   - Batch: per batch BEGIN; one INSERT … SELECT unnest($1) ON CONFLICT DO
//     NOTHING RETURNING key; the UPDATEs of the new keys pipelined in one
//     round trip; COMMIT.
//   - Chain: idemq's own protocol at batch 1, written by hand on a held
//     connection: a message's claim is pipelined with the COMMIT AND CHAIN
//     of the one before it (with BEGIN when nothing is open) and its UPDATE
//     is the second round trip. It is the floor the Runner's batch-1 path
//     can reach: two round trips per message and no bookkeeping.
//
// It also has the round-robin driver and the report the benchmarks share:
// every workload runs twice, in alternating order, and the ratios are
// printed from the same run.
package handwritten

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
)

// Msg is one decoded message for the hand-written worker.
type Msg struct {
	Key     string
	Account int
	Amount  int64
}

// Decode parses the benchmarks' JSON body {"account":…,"amount":…}.
func Decode(key string, body []byte) (Msg, error) {
	var o struct {
		Account int   `json:"account"`
		Amount  int64 `json:"amount"`
	}
	if err := json.Unmarshal(body, &o); err != nil {
		return Msg{}, fmt.Errorf("decode %s: %w", key, err)
	}
	return Msg{Key: key, Account: o.Account, Amount: o.Amount}, nil
}

// DB runs the hand-written transactions against schema's accounts table and
// its own processed table.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
}

func (d DB) processed() string { return d.Schema + ".hand_processed" }

// Setup creates the processed table.
func (d DB) Setup(ctx context.Context) error {
	_, err := d.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+d.processed()+
		` (key text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// One applies m in its own transaction, unless its key was processed before,
// and returns the number of UPDATEs it applied (0 or 1).
func (d DB) One(ctx context.Context, m Msg) (int, error) {
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) // after Commit it is a no-op
	tag, err := tx.Exec(ctx, `INSERT INTO `+d.processed()+` (key) VALUES ($1) ON CONFLICT DO NOTHING`, m.Key)
	if err != nil {
		return 0, err
	}
	applied := int(tag.RowsAffected())
	if applied == 1 {
		if _, err := tx.Exec(ctx, `UPDATE `+d.Schema+`.accounts SET balance = balance + $1 WHERE id = $2`, m.Amount, m.Account); err != nil {
			return 0, err
		}
	}
	return applied, tx.Commit(ctx)
}

// Chain is a connection held by one hand-written worker that applies one
// message per transaction in two round trips (see the package comment). Use
// it from one goroutine: Claim a message, Apply it, then Claim the next one,
// which commits it, or Commit when no next one is waiting.
type Chain struct {
	db    DB
	conn  *pgxpool.Conn
	open  bool // a transaction is open, holding the claimed message
	fresh bool // the claimed message's key was new
}

// Chain acquires a connection for a Chain.
func (d DB) Chain(ctx context.Context) (*Chain, error) {
	conn, err := d.Pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &Chain{db: d, conn: conn}, nil
}

// Release rolls back what is open and returns the connection to the pool.
func (c *Chain) Release(ctx context.Context) {
	if c.open {
		_, _ = c.conn.Exec(ctx, `ROLLBACK`)
	}
	c.conn.Release()
}

// Claim inserts m's key in a new transaction, in one round trip: after
// COMMIT AND CHAIN when a transaction is open (which commits the message
// claimed before) and after BEGIN otherwise.
func (c *Chain) Claim(ctx context.Context, m Msg) error {
	b := &pgx.Batch{}
	if c.open {
		b.Queue(`COMMIT AND CHAIN`)
	} else {
		b.Queue(`BEGIN`)
	}
	b.Queue(`INSERT INTO `+c.db.processed()+` (key) VALUES ($1) ON CONFLICT DO NOTHING`, m.Key)
	br := c.conn.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	c.open, c.fresh = err == nil, tag.RowsAffected() == 1
	return err
}

// Apply runs the claimed message's UPDATE if its key was new and returns the
// number of UPDATEs it applied (0 or 1).
func (c *Chain) Apply(ctx context.Context, m Msg) (int, error) {
	if !c.fresh {
		return 0, nil
	}
	_, err := c.conn.Exec(ctx, `UPDATE `+c.db.Schema+`.accounts SET balance = balance + $1 WHERE id = $2`, m.Amount, m.Account)
	if err != nil {
		return 0, err
	}
	return 1, nil
}

// Commit commits the open transaction.
func (c *Chain) Commit(ctx context.Context) error {
	c.open = false
	tag, err := c.conn.Exec(ctx, `COMMIT`)
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	return err
}

// Batch applies the messages of ms whose keys were not processed before, in
// one transaction, and returns the number of UPDATEs it applied.
func (d DB) Batch(ctx context.Context, ms []Msg) (int, error) {
	keys := make([]string, len(ms))
	for i, m := range ms {
		keys[i] = m.Key
	}
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) // after Commit it is a no-op
	rows, err := tx.Query(ctx, `INSERT INTO `+d.processed()+` (key) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING RETURNING key`, keys)
	if err != nil {
		return 0, err
	}
	fresh := make(map[string]bool, len(ms))
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return 0, err
		}
		fresh[k] = true
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	// Rows in one order in every transaction: concurrent batches never
	// deadlock on crossing row locks.
	sorted := slices.Clone(ms)
	slices.SortStableFunc(sorted, func(a, b Msg) int { return cmp.Compare(a.Account, b.Account) })
	var b pgx.Batch
	for _, m := range sorted {
		if fresh[m.Key] {
			fresh[m.Key] = false // a key twice in one batch applies once
			b.Queue(`UPDATE `+d.Schema+`.accounts SET balance = balance + $1 WHERE id = $2`, m.Amount, m.Account)
		}
	}
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return 0, err
		}
	}
	return b.Len(), tx.Commit(ctx)
}

// Workload is one row of a benchmark. Run consumes N messages and returns
// the time from the first message to the last acknowledgement, and the
// number of UPDATEs it applied (for the balance check).
type Workload struct {
	Name string
	N    int
	// Groups names the comparisons the workload takes part in; Base marks
	// the hand-written baseline of each of its groups.
	Groups []string
	Base   bool
	Run    func(ctx context.Context, round int) (time.Duration, error)
}

// Filter returns the workloads selected by only: all of them when only is
// empty, else those selected by any of its "|"-separated alternatives, where
// an alternative selects the one workload whose name it is, or else every
// workload whose name contains it.
func Filter(ws []*Workload, only string) []*Workload {
	if only == "" {
		return ws
	}
	var out []*Workload
	for _, w := range ws {
		for alt := range strings.SplitSeq(only, "|") {
			if selects(ws, alt, w) {
				out = append(out, w)
				break
			}
		}
	}
	return out
}

// selects reports whether the alternative alt selects w among ws.
func selects(ws []*Workload, alt string, w *Workload) bool {
	for _, x := range ws {
		if x.Name == alt {
			return x == w
		}
	}
	return strings.Contains(w.Name, alt)
}

// Result is one measured run.
type Result struct {
	Workload *Workload
	Round    int
	D        time.Duration
	CPU      time.Duration // the client's CPU time per message, if the run noted it (NoteUsage)
}

// Rate is messages per second.
func (r Result) Rate() float64 { return float64(r.Workload.N) / r.D.Seconds() }

// Rounds runs every workload rounds times, in forward order in odd rounds
// and in reverse order in even ones, printing each result as it comes.
func Rounds(ctx context.Context, ws []*Workload, rounds int) ([]Result, error) {
	var out []Result
	for round := 1; round <= rounds; round++ {
		order := make([]*Workload, len(ws))
		copy(order, ws)
		if round%2 == 0 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, w := range order {
			d, err := w.Run(ctx, round)
			if err != nil {
				return out, fmt.Errorf("%s (round %d): %w", w.Name, round, err)
			}
			r := Result{Workload: w, Round: round, D: d, CPU: takeCPU()}
			fmt.Printf("  round %d  %-62s %7d msgs %7.2f s %9.0f msg/s\n", round, w.Name, w.N, d.Seconds(), r.Rate())
			FlushNotes()
			out = append(out, r)
		}
	}
	return out, nil
}

// Report prints, per workload, the rate of each round and the mean, and for
// every group the ratio of each workload to the group's hand-written
// baseline, per round and over the means.
func Report(ws []*Workload, results []Result, rounds int) {
	rates := map[*Workload][]float64{}
	cpus := map[*Workload][]float64{}
	for _, r := range results {
		rates[r.Workload] = append(rates[r.Workload], r.Rate())
		if r.CPU > 0 {
			cpus[r.Workload] = append(cpus[r.Workload], float64(r.CPU))
		}
	}
	mean := func(w *Workload) float64 { return meanOf(rates[w]) }
	fmt.Printf("\n%-62s %8s", "workload", "messages")
	for i := 1; i <= rounds; i++ {
		fmt.Printf(" %9s", fmt.Sprintf("round %d", i))
	}
	fmt.Printf(" %9s\n", "mean")
	for _, w := range ws {
		fmt.Printf("%-62s %8d", w.Name, w.N)
		for _, v := range rates[w] {
			fmt.Printf(" %9.0f", v)
		}
		fmt.Printf(" %9.0f\n", mean(w))
	}
	groups := map[string][]*Workload{}
	var names []string
	for _, w := range ws {
		for _, g := range w.Groups {
			if groups[g] == nil {
				names = append(names, g)
			}
			groups[g] = append(groups[g], w)
		}
	}
	sort.Strings(names)
	fmt.Println()
	for _, g := range names {
		var base *Workload
		for _, w := range groups[g] {
			if w.Base {
				base = w
			}
		}
		if base == nil {
			continue
		}
		for _, w := range groups[g] {
			if w == base {
				continue
			}
			var per []string
			for i := range rates[w] {
				if i < len(rates[base]) {
					per = append(per, fmt.Sprintf("%.2fx", rates[w][i]/rates[base][i]))
				}
			}
			fmt.Printf("ratio %s: %s / %s = %.2fx (rounds: %s)\n", g, w.Name, base.Name, mean(w)/mean(base), strings.Join(per, ", "))
			if c, cb := cpus[w], cpus[base]; len(c) == len(rates[w]) && len(cb) == len(rates[base]) {
				per = per[:0]
				for i := range c {
					if i < len(cb) {
						per = append(per, fmt.Sprintf("%.2fx", c[i]/cb[i]))
					}
				}
				fmt.Printf("  client CPU per message: %.2fx the baseline's (rounds: %s)\n", meanOf(c)/meanOf(cb), strings.Join(per, ", "))
			}
		}
	}
}

// meanOf is the mean of vs.
func meanOf(vs []float64) float64 {
	s := 0.0
	for _, v := range vs {
		s += v
	}
	return s / float64(len(vs))
}

// StartCPUProfile starts a CPU profile of the process into the file at path
// and returns the function that stops it and closes the file. An empty path
// profiles nothing (stop does nothing).
func StartCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// SentHeader is the header in which the benchmarks' paced producers put
// the send time (Unix nanoseconds, decimal).
const SentHeader = "bench-sent-at"

// Latency records the latency of every message a Runner acknowledges, to
// the end of the Source.Ack call that covered it: from Message.ReceivedAt
// (when the source received it), and from the send time in SentHeader when
// the message has one (which also counts the time a message waits in the
// broker, so that sources holding different numbers of messages compare
// fairly). Add it to consumer.Config.Hooks. It is safe for concurrent use.
type Latency struct {
	mu    sync.Mutex
	d     []time.Duration
	sent  []time.Duration
	since time.Time
}

// OnAck implements consumer.HookAck.
func (l *Latency) OnAck(_ context.Context, a consumer.AckInfo) {
	if a.Err != nil {
		return
	}
	l.mu.Lock()
	for _, m := range a.Messages {
		if !m.ReceivedAt.IsZero() && !m.ReceivedAt.Before(l.since) {
			l.d = append(l.d, a.End.Sub(m.ReceivedAt))
			if ns, err := strconv.ParseInt(m.Headers[SentHeader], 10, 64); err == nil {
				l.sent = append(l.sent, a.End.Sub(time.Unix(0, ns)))
			}
		}
	}
	l.mu.Unlock()
}

// Percentiles returns the count and the p50 and p99 of the receipt-to-ack
// latencies recorded.
func (l *Latency) Percentiles() (n int, p50, p99 time.Duration) {
	l.mu.Lock()
	d := slices.Clone(l.d)
	l.mu.Unlock()
	return percentiles(d)
}

// SentPercentiles is Percentiles of the send-to-ack latencies.
func (l *Latency) SentPercentiles() (n int, p50, p99 time.Duration) {
	l.mu.Lock()
	d := slices.Clone(l.sent)
	l.mu.Unlock()
	return percentiles(d)
}

func percentiles(d []time.Duration) (n int, p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0, 0
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return len(d), at(0.50), at(0.99)
}

// String formats the percentiles for a report line.
func (l *Latency) String() string {
	n, p50, p99 := l.Percentiles()
	return fmt.Sprintf("receipt-to-ack p50 %.2fms p99 %.2fms (%d messages)", ms(p50), ms(p99), n)
}

// Usage is the process's CPU time and heap allocations since Start: the
// client side of a measurement (the database and the broker run in other
// processes).
type Usage struct {
	cpu    time.Duration
	allocs uint64
}

// StartUsage snapshots the process's CPU time and allocation count.
func StartUsage() Usage {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return Usage{cpu: processCPU(), allocs: ms.Mallocs}
}

// Per returns the CPU time and the allocations per message since u, over n
// messages.
func (u Usage) Per(n int) (cpu time.Duration, allocs float64) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if n <= 0 {
		return 0, 0
	}
	return (processCPU() - u.cpu) / time.Duration(n), float64(ms.Mallocs-u.allocs) / float64(n)
}

// notes holds the lines about the run in progress (its client usage, its
// batch sizes), which Rounds prints below its row (see FlushNotes).
var notes struct {
	sync.Mutex
	lines []string
	cpu   time.Duration // per message, from the last NoteUsage
}

// Note records a line about the run in progress, to be printed below its
// row by FlushNotes, indented under it.
func Note(format string, args ...any) {
	notes.Lock()
	defer notes.Unlock()
	notes.lines = append(notes.lines, "           "+fmt.Sprintf(format, args...))
}

// NoteUsage notes the client's CPU time and allocations per message since u,
// over n messages.
func NoteUsage(u Usage, n int) {
	cpu, allocs := u.Per(n)
	notes.Lock()
	notes.cpu = cpu
	notes.Unlock()
	Note("client: %.1f µs CPU and %.1f allocations per message", float64(cpu)/float64(time.Microsecond), allocs)
}

// takeCPU returns the CPU time per message the run in progress noted, and
// forgets it.
func takeCPU() time.Duration {
	notes.Lock()
	defer notes.Unlock()
	cpu := notes.cpu
	notes.cpu = 0
	return cpu
}

// FlushNotes prints the lines noted since the last call. Rounds calls it
// after each row; a bench that prints its own rows calls it after each of
// them.
func FlushNotes() {
	notes.Lock()
	defer notes.Unlock()
	for _, l := range notes.lines {
		fmt.Println(l)
	}
	notes.lines = nil
}

// processCPU is the user and system CPU time of the process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Reset forgets what was recorded so far, and ignores from then on the
// messages received before the call.
func (l *Latency) Reset() {
	l.mu.Lock()
	l.d, l.sent = l.d[:0], l.sent[:0]
	l.since = time.Now()
	l.mu.Unlock()
}

// StartMemProfile samples every 4 KiB of heap allocation (for counts close
// to the allocations per message) and returns the function that writes the
// allocation profile to the file at path. An empty path does nothing.
func StartMemProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	runtime.MemProfileRate = 4096
	return func() {
		_ = pprof.Lookup("allocs").WriteTo(f, 0)
		_ = f.Close()
	}, nil
}
