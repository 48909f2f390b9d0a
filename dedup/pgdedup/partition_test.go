package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
)

// testClock is a clock a test sets (pgdedup.Config.Now).
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// day0 is the first day of the boundary scenarios, far from the real
// clock's.
var day0 = time.Date(2030, 3, 10, 0, 0, 0, 0, time.UTC)

// boundaryRetention is the retention of the boundary scenarios.
const boundaryRetention = 3 * 24 * time.Hour

// partitioned is a partitioned store with its own clock, and a way to make
// more stores on the same table, each with its own clock (workers whose
// clocks straddle midnight).
type partitioned struct {
	*pgdedup.Store
	pool  *pgxpool.Pool
	clock *testClock
	naive bool
}

func newPartitioned(t *testing.T, naive bool) *partitioned {
	t.Helper()
	clock := &testClock{t: day0.Add(12 * time.Hour)}
	s, pool := newStore(t, pgdedup.Config{Partitioned: true, Retention: boundaryRetention, Now: clock.Now})
	p := &partitioned{Store: s, pool: pool, clock: clock, naive: naive}
	if naive {
		pgdedup.PlantNaiveClaim(s)
	}
	if _, err := s.Cleanup(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return p
}

// other returns another store on p's table, with its own clock at at.
func (p *partitioned) other(at time.Time) (*pgdedup.Store, error) {
	clock := &testClock{t: at}
	cfg := p.Config()
	cfg.Now = clock.Now
	s, err := pgdedup.New(p.pool, cfg)
	if err == nil && p.naive {
		pgdedup.PlantNaiveClaim(s)
	}
	return s, err
}

// at sets p's clock to t and runs the janitor, which creates the
// partitions of t's day and drops the expired ones.
func (p *partitioned) at(ctx context.Context, t time.Time) error {
	p.clock.Set(t)
	_, err := p.Cleanup(ctx)
	return err
}

// claimOn claims recs through s in a new transaction, which it commits after
// storing results (when not nil) unless keep is set; then it returns tx open.
func claimOn(ctx context.Context, s *pgdedup.Store, scope string, results []dedup.Result, keep bool, recs ...dedup.Record) (pgx.Tx, []dedup.Claim, error) {
	d := s.Driver()
	tx, cs, err := d.BeginClaim(ctx, scope, recs)
	if err != nil {
		return nil, nil, err
	}
	if err := d.StoreResults(ctx, tx, scope, results); err != nil {
		_ = d.Rollback(ctx, tx)
		return nil, nil, err
	}
	if keep {
		return tx, cs, nil
	}
	return nil, cs, d.Commit(ctx, tx)
}

// wantStates returns an error naming the first claim of cs whose state is
// not want's.
func wantStates(what string, cs []dedup.Claim, want ...dedup.State) error {
	for i, c := range cs {
		if c.State != want[i] {
			return fmt.Errorf("%s: key %q: state %v, want %v", what, c.Key, c.State, want[i])
		}
	}
	return nil
}

// boundaryScenarios are the claims whose first record lives in an older
// partition than the clock's day, or straddle midnight. Each returns an
// error when the store got it wrong.
var boundaryScenarios = []struct {
	name string
	run  func(ctx context.Context, p *partitioned) error
}{
	{"RedeliveryNextDay", func(ctx context.Context, p *partitioned) error {
		if _, _, err := claimOn(ctx, p.Store, "s", nil, false, rec("k", "a")); err != nil {
			return err
		}
		if err := p.at(ctx, day0.Add(36*time.Hour)); err != nil {
			return err
		}
		// A batch: the key of yesterday and a new one.
		_, cs, err := claimOn(ctx, p.Store, "s", nil, false, rec("k", "a"), rec("new", "a"))
		if err != nil {
			return err
		}
		if err := wantStates("redelivery a day later", cs, dedup.StateDone, dedup.StateNew); err != nil {
			return err
		}
		_, cs, err = claimOn(ctx, p.Store, "s", nil, false, rec("k", "a"))
		if err != nil {
			return err
		}
		return wantStates("redelivery a day later, alone", cs, dedup.StateDone)
	}},
	{"ConcurrentAcrossMidnight", func(ctx context.Context, p *partitioned) error {
		midnight := day0.AddDate(0, 0, 1)
		if err := p.at(ctx, midnight.Add(-time.Millisecond)); err != nil {
			return err
		}
		before, err := p.other(midnight.Add(-time.Millisecond))
		if err != nil {
			return err
		}
		after, err := p.other(midnight.Add(time.Millisecond))
		if err != nil {
			return err
		}
		tx, cs, err := claimOn(ctx, before, "s", nil, true, rec("k", "a"))
		if err != nil {
			return err
		}
		defer func() { _ = before.Driver().Rollback(context.WithoutCancel(ctx), tx) }()
		if err := wantStates("claim before midnight", cs, dedup.StateNew); err != nil {
			return err
		}
		type outcome struct {
			cs  []dedup.Claim
			err error
		}
		second := make(chan outcome, 1)
		go func() {
			_, cs, err := claimOn(ctx, after, "s", nil, false, rec("k", "a"))
			second <- outcome{cs, err}
		}()
		// Commit the first claim once the second waits for it, or has
		// returned without waiting.
		var got *outcome
		for got == nil {
			select {
			case o := <-second:
				got = &o
				continue
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
			var waiting bool
			if err := p.pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_locks WHERE NOT granted AND locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting); err != nil {
				return err
			}
			if waiting {
				break
			}
		}
		if err := before.Driver().Commit(ctx, tx); err != nil {
			return err
		}
		if got == nil {
			o := <-second
			got = &o
		}
		if got.err != nil {
			return got.err
		}
		return wantStates("claim 2 ms later, after midnight", got.cs, dedup.StateDone)
	}},
	{"DuplicateWhileOldPartitionIsDropped", func(ctx context.Context, p *partitioned) error {
		// A record in the window's oldest partition that may not be
		// dropped yet, and one in the partition before, which may.
		if _, _, err := claimOn(ctx, p.Store, "s", nil, false, rec("older", "a")); err != nil {
			return err
		}
		first := day0.AddDate(0, 0, 1).Add(23 * time.Hour)
		if err := p.at(ctx, first); err != nil {
			return err
		}
		if _, _, err := claimOn(ctx, p.Store, "s", nil, false, rec("k", "a")); err != nil {
			return err
		}
		// A minute before k expires: day0's partition ended a retention
		// ago, the partition of k did not.
		edge := first.Add(boundaryRetention - time.Minute)
		// The partitions up to the edge's day exist; day0's is still there.
		if err := p.at(ctx, edge.AddDate(0, 0, -1)); err != nil {
			return err
		}
		p.clock.Set(edge)
		dup, err := p.other(edge)
		if err != nil {
			return err
		}
		var (
			wg       sync.WaitGroup
			cleanErr error
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, cleanErr = p.Cleanup(ctx)
		}()
		_, cs, err := claimOn(ctx, dup, "s", nil, false, rec("k", "a"))
		wg.Wait()
		if err != nil {
			return err
		}
		if cleanErr != nil && !errors.Is(cleanErr, context.Canceled) {
			// A drop that timed out on the table lock is retried.
			if _, err := p.Cleanup(ctx); err != nil {
				return err
			}
		}
		if err := wantStates("duplicate at the window's edge", cs, dedup.StateDone); err != nil {
			return err
		}
		if _, err := p.Inspect(ctx, "s", "k"); err != nil {
			return fmt.Errorf("record of k after the drop: %w", err)
		}
		if _, err := p.Inspect(ctx, "s", "older"); !errors.Is(err, dedup.ErrNotFound) {
			return fmt.Errorf("record of a partition a retention past its day: %w, want dropped", err)
		}
		return nil
	}},
	{"ResultInOlderPartition", func(ctx context.Context, p *partitioned) error {
		res := []dedup.Result{{Key: "k", Value: []byte("receipt-1")}}
		if _, _, err := claimOn(ctx, p.Store, "s", res, false, rec("k", "a")); err != nil {
			return err
		}
		if err := p.at(ctx, day0.Add(60*time.Hour)); err != nil {
			return err
		}
		_, cs, err := claimOn(ctx, p.Store, "s", nil, false, rec("k", "a"))
		if err != nil {
			return err
		}
		if err := wantStates("redelivery two days later", cs, dedup.StateDone); err != nil {
			return err
		}
		if string(cs[0].Result) != "receipt-1" {
			return fmt.Errorf("stored result two days later: %q, want %q", cs[0].Result, "receipt-1")
		}
		return nil
	}},
	{"MismatchAgainstOlderPartition", func(ctx context.Context, p *partitioned) error {
		if _, _, err := claimOn(ctx, p.Store, "s", nil, false, rec("k", "a")); err != nil {
			return err
		}
		if err := p.at(ctx, day0.Add(36*time.Hour)); err != nil {
			return err
		}
		_, cs, err := claimOn(ctx, p.Store, "s", nil, false, rec("k", "another payload"))
		if err != nil {
			return err
		}
		return wantStates("other payload a day later", cs, dedup.StateMismatch)
	}},
}

// TestPartitionBoundary runs each boundary scenario on a partitioned
// table.
func TestPartitionBoundary(t *testing.T) {
	for _, sc := range boundaryScenarios {
		t.Run(sc.name, func(t *testing.T) {
			p := newPartitioned(t, false)
			if err := sc.run(testCtx(t), p); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPartitionBoundaryCatchesNaiveClaim runs the boundary scenarios
// against the claim that looks only at the clock's day (PlantNaiveClaim):
// every one of them must fail, or it tests nothing.
func TestPartitionBoundaryCatchesNaiveClaim(t *testing.T) {
	for _, sc := range boundaryScenarios {
		t.Run(sc.name, func(t *testing.T) {
			p := newPartitioned(t, true)
			err := sc.run(testCtx(t), p)
			if err == nil {
				t.Fatal("the naive claim passed: the scenario cannot fail")
			}
			t.Logf("naive claim caught: %v", err)
		})
	}
}

// TestPartitionDropKeepsLongerRetention: stores of several scopes share a
// table, each with its own retention. The janitor of the shortest drops no
// partition that holds a record another store still remembers.
func TestPartitionDropKeepsLongerRetention(t *testing.T) {
	ctx := testCtx(t)
	p := newPartitioned(t, false) // retention 3 days
	cfg := p.Config()
	cfg.Retention = 8 * 24 * time.Hour
	long, err := pgdedup.New(p.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := claimOn(ctx, long, "long", nil, false, rec("k", "a")); err != nil {
		t.Fatal(err)
	}
	if err := p.at(ctx, day0.AddDate(0, 0, 5)); err != nil {
		t.Fatal(err)
	}
	e, err := p.Inspect(ctx, "long", "k")
	if err != nil {
		t.Fatalf("a record of an 8-day retention after the 3-day janitor's run, 5 days later: %v", err)
	}
	// Once it expired, its partition goes.
	if err := p.at(ctx, e.ExpiresAt.AddDate(0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Inspect(ctx, "long", "k"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("the record a day after it expired: %v, want its partition dropped", err)
	}
}

// TestPartitionClaimPlansForTheDaysRecords: a claim reads a day's partition
// through its index once the day's records fill it, although the
// connection ran the claim's statements many times while the partition
// was empty (so that PostgreSQL could cache a generic plan that reads
// the empty partition whole). pg_stat_xact_user_tables counts the rows the
// claim's transaction read from the partition by sequential scan.
func TestPartitionClaimPlansForTheDaysRecords(t *testing.T) {
	ctx := testCtx(t)
	// One connection, so that every claim runs on the connection whose
	// prepared statements were planned while tomorrow was empty.
	s, pool, clock, table := onePartitionedConn(t)
	tomorrow := partitionOf(s, day0.AddDate(0, 0, 1))
	// No autovacuum ANALYZE replaces a cached plan during the test; an
	// operator's ANALYZE of the table (or vacuumdb's) records tomorrow's
	// partition as empty.
	if _, err := pool.Exec(ctx, `ALTER TABLE `+tomorrow+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	keys := func(prefix string, n int) []dedup.Record {
		recs := make([]dedup.Record, n)
		for i := range recs {
			recs[i] = rec(fmt.Sprintf("%s-%03d", prefix, i), "body")
		}
		return recs
	}
	// Today: every statement of the claim runs more than five times, at
	// batch 1 and 100, and a redelivery's lookup too.
	for i := range 8 {
		for _, n := range []int{1, 100} {
			recs := keys(fmt.Sprintf("today-%d-%d", i, n), n)
			if _, _, err := claimOn(ctx, s, "plans", nil, false, recs...); err != nil {
				t.Fatal(err)
			}
			if _, cs, err := claimOn(ctx, s, "plans", nil, false, recs...); err != nil {
				t.Fatal(err)
			} else if err := allStates("redelivery", cs, dedup.StateDone); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Tomorrow's records fill its partition.
	const filled = 20000
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, key, payload_hash, processed_at, expires_at)
SELECT 'plans', 'filled-' || g, sha256(g::text::bytea), $1::timestamptz, $1::timestamptz + interval '3 days' FROM generate_series(1, $2) g`,
		day0.AddDate(0, 0, 1).Add(time.Hour), filled); err != nil {
		t.Fatal(err)
	}
	clock.Set(day0.AddDate(0, 0, 1).Add(12 * time.Hour))
	for _, n := range []int{1, 100} {
		t.Run(fmt.Sprintf("batch %d", n), func(t *testing.T) {
			recs := keys(fmt.Sprintf("tomorrow-%d", n), n)
			before, err := seqRead(ctx, pool, tomorrow)
			if err != nil {
				t.Fatal(err)
			}
			// A claim, a redelivery's lookup in the same transaction, and a
			// stored result.
			tx, cs, err := claimOn(ctx, s, "plans", nil, true, append(recs, rec("filled-1", "x"))...)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Driver().Rollback(ctx, tx) }()
			if err := allStates("claim", cs[:n], dedup.StateNew); err != nil {
				t.Fatal(err)
			}
			after, err := seqRead(ctx, tx, tomorrow)
			if err != nil {
				t.Fatal(err)
			}
			if read := after - before; read > 0 {
				t.Fatalf("the claim of %d keys read %d records of tomorrow's partition by sequential scan (it holds %d): a plan cached while it was empty", n, read, filled)
			}
		})
	}
}

// onePartitionedConn returns a partitioned store over a pool of one
// connection, its clock at noon on day0 and the janitor's partitions made,
// with the clock and the table's quoted name.
func onePartitionedConn(t *testing.T) (*pgdedup.Store, *pgxpool.Pool, *testClock, string) {
	t.Helper()
	clock := &testClock{t: day0.Add(12 * time.Hour)}
	s, pool := newStoreOn(t, pgdedup.Config{Partitioned: true, Retention: boundaryRetention, Now: clock.Now},
		func(c *pgxpool.Config) { c.MaxConns = 1 })
	if _, err := s.Cleanup(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return s, pool, clock, pgx.Identifier{s.Config().Schema, s.Config().Table}.Sanitize()
}

// partitionOf returns the quoted name of the janitor's partition of day
// (<table>_pYYYYMMDD).
func partitionOf(s *pgdedup.Store, day time.Time) string {
	return pgx.Identifier{s.Config().Schema, s.Config().Table + "_p" + day.UTC().Format("20060102")}.Sanitize()
}

// seqRead returns the records read from partition by sequential scans so
// far, those that this connection has not reported yet included (they stay
// in its own statistics for up to a second), as seen on db's connection.
func seqRead(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, partition string) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT coalesce((SELECT seq_tup_read FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)
+ coalesce((SELECT seq_tup_read FROM pg_stat_xact_user_tables WHERE relid = $1::regclass), 0)`, partition).Scan(&n)
	return n, err
}

// allStates returns an error naming the first claim of cs whose state is
// not want.
func allStates(what string, cs []dedup.Claim, want dedup.State) error {
	for _, c := range cs {
		if c.State != want {
			return fmt.Errorf("%s: key %q: state %v, want %v", what, c.Key, c.State, want)
		}
	}
	return nil
}

// TestPartitionDropReadsNoExpiredRecord: the janitor finds that a
// partition whose records all expired keeps nothing without reading it by
// sequential scan: its BRIN index on expires_at (migration 005, which the
// janitor's partitions get from the parent) leaves out every block range
// that vacuum summarized. A transaction holds the partition while the
// janitor runs, so that its drop times out and the statistics of the
// reads outlive the check; once released, the partition goes.
func TestPartitionDropReadsNoExpiredRecord(t *testing.T) {
	ctx := testCtx(t)
	// One connection, whose statistics not yet reported seqRead sees.
	s, pool, clock, table := onePartitionedConn(t)
	part := partitionOf(s, day0)
	const records = 30000
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, key, payload_hash, processed_at, expires_at)
SELECT 'drop', 'k-' || g, sha256(g::text::bytea), $1::timestamptz + g * interval '1 second', $1::timestamptz + interval '3 days' + g * interval '1 second'
FROM generate_series(1, $2) g`, day0, records); err != nil {
		t.Fatal(err)
	}
	// As autovacuum does after a day's inserts (no ANALYZE: the check must
	// not depend on the partition's statistics).
	if _, err := pool.Exec(ctx, `VACUUM `+part); err != nil {
		t.Fatal(err)
	}
	holder, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close(ctx) }()
	hold, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.Exec(ctx, `LOCK TABLE `+part+` IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	before, err := seqRead(ctx, pool, part)
	if err != nil {
		t.Fatal(err)
	}
	// Every record expired a day ago; the drop times out on the lock.
	clock.Set(day0.AddDate(0, 0, 4).Add(12 * time.Hour))
	if _, err := s.Cleanup(ctx); err == nil {
		t.Fatal("Cleanup while a transaction holds the partition: nil error, want its drop timed out")
	}
	after, err := seqRead(ctx, pool, part)
	if err != nil {
		t.Fatal(err)
	}
	if read := after - before; read > 0 {
		t.Fatalf("the janitor read %d records of the expired partition by sequential scan (it holds %d)", read, records)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	var left bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, part).Scan(&left); err != nil || left {
		t.Fatalf("the expired partition after Cleanup: exists %v, %v; want dropped", left, err)
	}
}
