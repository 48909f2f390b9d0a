package pgdedup_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/dedup/pgdedup"
)

// claimLoad runs workers that claim new keys at batch 1, each holding its
// transaction for hold (a handler), and records when each claim started
// and how long it took from BEGIN to COMMIT.
type claimLoad struct {
	mu    sync.Mutex
	spans [][2]time.Time
	stop  atomic.Bool
	wg    sync.WaitGroup
	err   atomic.Value
}

func startLoad(ctx context.Context, s *pgdedup.Store, workers int, hold time.Duration) *claimLoad {
	l := &claimLoad{}
	h := dedup.HashPayload([]byte("{}"))
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			d := s.Driver()
			for i := 0; !l.stop.Load(); i++ {
				start := time.Now()
				tx, _, err := d.BeginClaim(ctx, "load", []dedup.Record{{Key: fmt.Sprintf("w%d-%d-%d", w, start.UnixNano(), i), PayloadHash: h}})
				if err != nil {
					l.err.Store(err)
					return
				}
				time.Sleep(hold)
				if err := d.Commit(ctx, tx); err != nil {
					l.err.Store(err)
					return
				}
				l.mu.Lock()
				l.spans = append(l.spans, [2]time.Time{start, time.Now()})
				l.mu.Unlock()
			}
		}()
	}
	return l
}

func (l *claimLoad) end() error {
	l.stop.Store(true)
	l.wg.Wait()
	if err, ok := l.err.Load().(error); ok {
		return err
	}
	return nil
}

// during returns the claims' durations (minus hold) that overlapped
// [from, to], and those that did not, each sorted.
func (l *claimLoad) during(from, to time.Time, hold time.Duration) (in, out []time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, sp := range l.spans {
		d := sp[1].Sub(sp[0]) - hold
		if sp[1].Before(from) || sp[0].After(to) {
			out = append(out, d)
		} else {
			in = append(in, d)
		}
	}
	slices.Sort(in)
	slices.Sort(out)
	return in, out
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}

// report writes the claims' figures of a window as metrics and a log line.
func report(b *testing.B, what string, took time.Duration, in, out []time.Duration) {
	b.Logf("%s took %s; claims during it: %d, p50 %s, p99 %s, max %s; claims outside it: %d, p50 %s, p99 %s, max %s",
		what, took.Round(time.Microsecond), len(in), pct(in, .5), pct(in, .99), pct(in, 1),
		len(out), pct(out, .5), pct(out, .99), pct(out, 1))
	b.ReportMetric(float64(pct(in, 1).Microseconds()), what+"-max-claim-µs")
	b.ReportMetric(float64(pct(out, 1).Microseconds()), "baseline-max-claim-µs")
}

// BenchmarkPartitionLockWait measures what claims see while the janitor
// creates and drops partitions, and while migration 004 partitions a
// table: 4 workers claim new keys at batch 1, each holding its transaction
// 5 ms as a handler would; a claim's time (BEGIN to COMMIT, less the 5 ms)
// during the DDL is compared with its time outside it.
//
//	go test -run '^$' -bench PartitionLockWait -benchtime 1x ./dedup/pgdedup
func BenchmarkPartitionLockWait(b *testing.B) {
	const (
		workers = 4
		hold    = 5 * time.Millisecond
		rows    = 200_000
	)
	b.Run("maintenance", func(b *testing.B) {
		s, pool := newStore(b, pgdedup.Config{Partitioned: true})
		ctx := b.Context()
		t := pgx.Identifier{s.Config().Schema, s.Config().Table}.Sanitize()
		// The migration's first partition covers every time before the day
		// after tomorrow: daily ones replace it.
		var first string
		if err := pool.QueryRow(ctx, `SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = $1::regclass`, t).Scan(&first); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `DROP TABLE `+first); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Cleanup(ctx); err != nil {
			b.Fatal(err)
		}
		load := startLoad(ctx, s, workers, hold)
		var creates, drops [][2]time.Time
		for round := 1; round <= 3; round++ {
			// A janitor whose clock is round days ahead creates a
			// partition; then, given a full partition of a day long past,
			// drops it.
			cfg := s.Config()
			cfg.Now = func() time.Time { return time.Now().AddDate(0, 0, round) }
			janitor, err := pgdedup.New(pool, cfg)
			if err != nil {
				b.Fatal(err)
			}
			for _, step := range []string{"create", "drop"} {
				if step == "drop" {
					day := fmt.Sprintf("2020-01-%02d", round)
					old := pgx.Identifier{s.Config().Schema, s.Config().Table + "_p202001" + day[8:]}.Sanitize()
					if _, err := pool.Exec(ctx, `CREATE TABLE `+old+` (LIKE `+t+` INCLUDING DEFAULTS);
ALTER TABLE `+t+` ATTACH PARTITION `+old+` FOR VALUES FROM ('`+day+` 00:00Z') TO ('`+day+` 00:00Z'::timestamptz + interval '1 day');
INSERT INTO `+t+` (scope, key, payload_hash, processed_at, expires_at)
SELECT 'old', 'k' || i, '\x00', '`+day+` 12:00Z', '`+day+` 12:00Z'::timestamptz + interval '8 days' FROM generate_series(1, `+strconv.Itoa(rows)+`) AS i;
ANALYZE `+old); err != nil {
						b.Fatal(err)
					}
				}
				time.Sleep(time.Second)
				from := time.Now()
				n, err := janitor.Cleanup(ctx)
				to := time.Now()
				b.Logf("round %d, %s: %s, %d records dropped, err %v", round, step, to.Sub(from).Round(time.Microsecond), n, err)
				if step == "create" {
					creates = append(creates, [2]time.Time{from, to})
				} else {
					drops = append(drops, [2]time.Time{from, to})
				}
			}
		}
		time.Sleep(time.Second)
		if err := load.end(); err != nil {
			b.Fatal(err)
		}
		for _, w := range []struct {
			name    string
			windows [][2]time.Time
		}{{"create", creates}, {"drop", drops}} {
			var in, out []time.Duration
			var took time.Duration
			for i, win := range w.windows {
				a, o := load.during(win[0], win[1], hold)
				in = append(in, a...)
				if i == 0 {
					out = o
				}
				took = max(took, win[1].Sub(win[0]))
			}
			slices.Sort(in)
			report(b, w.name, took, in, out)
		}
	})
	b.Run("migrate", func(b *testing.B) {
		s, pool := newStore(b, pgdedup.Config{})
		ctx := b.Context()
		t := pgx.Identifier{s.Config().Schema, s.Config().Table}.Sanitize()
		if _, err := pool.Exec(ctx, `INSERT INTO `+t+` (scope, key, payload_hash, processed_at, expires_at)
SELECT 'old', 'k' || i, '\x00', now() - (i % 192) * interval '1 hour', now() + interval '1 day'
FROM generate_series(1, `+strconv.Itoa(rows)+`) AS i; ANALYZE `+t); err != nil {
			b.Fatal(err)
		}
		cfg := s.Config()
		cfg.Partitioned = true
		claims, err := pgdedup.New(pool, cfg)
		if err != nil {
			b.Fatal(err)
		}
		m, err := migrate.NewPgx(pool, migrate.Config{Schema: cfg.Schema, Table: cfg.Table, Partitioned: true})
		if err != nil {
			b.Fatal(err)
		}
		load := startLoad(ctx, claims, workers, hold)
		time.Sleep(time.Second)
		p0 := time.Now()
		if err := m.Prepare(ctx); err != nil {
			b.Fatal(err)
		}
		p1 := time.Now()
		if _, err := m.Migrate(ctx); err != nil {
			b.Fatal(err)
		}
		p2 := time.Now()
		time.Sleep(time.Second)
		if err := load.end(); err != nil {
			b.Fatal(err)
		}
		in, out := load.during(p0, p1, hold)
		report(b, "prepare", p1.Sub(p0), in, out)
		in, out = load.during(p1, p2, hold)
		report(b, "migrate", p2.Sub(p1), in, out)
	})
}
