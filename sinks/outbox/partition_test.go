package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
)

// newPartitionedPool is newPool with the outbox table partitioned by day;
// before holds rows published while it was not (its first partition).
func newPartitionedPool(t *testing.T, before ...outbox.Message) *pgxpool.Pool {
	t.Helper()
	pool := newPool(t)
	insertPG(t, pool, before...)
	relaytest.MigrateOutbox(t, pool, migrate.Config{Partitioned: true})
	return pool
}

// partitionedRelay returns a relay with Config.Partitioned on pool, its
// partition maintenance's clock at now.
func partitionedRelay(t *testing.T, pool *pgxpool.Pool, pub outbox.Publisher, now time.Time) *outbox.Relay {
	t.Helper()
	cfg := testConfig()
	cfg.Partitioned, cfg.Retention = true, time.Hour
	r, err := outbox.NewRelay(pool, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	outbox.SetPartitionClock(r, func() time.Time { return now })
	return r
}

// partitions lists the outbox table's partitions by name.
func partitions(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var names []string
	err := pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(c.relname::text ORDER BY c.relname), '{}')
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'idemq_outbox'::regclass`).Scan(&names)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func execPG(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// The rows of a key go out in seq order when they lie in different
// partitions, the earlier ones in the later day's partition.
func TestPartitionedRelayOrderAcrossBoundary(t *testing.T) {
	ctx := context.Background()
	pool := newPartitionedPool(t, outbox.Message{ID: "a1", Destination: "d", Key: "k"})
	rec := &recorder{}
	r := partitionedRelay(t, pool, rec, time.Now())
	if _, err := r.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	insertPG(t, pool,
		outbox.Message{ID: "a2", Destination: "d", Key: "k"},
		outbox.Message{ID: "a3", Destination: "d", Key: "k"},
		outbox.Message{ID: "a4", Destination: "d", Key: "k"})
	// a1 and a2 move to the partition of the day after tomorrow (created
	// by Cleanup); a3 and a4 stay in the first one.
	execPG(t, pool, `UPDATE idemq_outbox SET created_at = now() + interval '2 days' WHERE id IN ('a1', 'a2')`)
	var parts int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT tableoid) FROM idemq_outbox`).Scan(&parts); err != nil || parts != 2 {
		t.Fatalf("rows in %d partitions (%v), want 2", parts, err)
	}
	drain(t, r)
	if got, want := rec.ids(), []string{"a1", "a2", "a3", "a4"}; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
}

// dropLeaves publishes three rows of a partition (one pending, one parked,
// one sent) and runs Cleanup with a clock five days ahead, with the drop
// planted by plant if set. It returns the rows left.
func dropLeaves(t *testing.T, plant func(*outbox.Relay)) map[string]int {
	ctx := context.Background()
	pool := newPartitionedPool(t,
		outbox.Message{ID: "pending", Destination: "d", Key: "p"},
		outbox.Message{ID: "parked", Destination: "d"},
		outbox.Message{ID: "sent", Destination: "d"})
	rec := &recorder{fail: func(m outbox.Message) error {
		if m.ID == "parked" {
			return errors.New("refused")
		}
		return nil
	}}
	// The pending row is due in an hour: the relay leaves it.
	execPG(t, pool, `UPDATE idemq_outbox SET next_attempt_at = now() + interval '1 hour' WHERE id = 'pending'`)
	r := partitionedRelay(t, pool, rec, time.Now())
	for range 10 {
		drain(t, r)
		if c, _ := r.Counts(ctx); c.Parked == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	later := partitionedRelay(t, pool, rec, time.Now().AddDate(0, 0, 5))
	if plant != nil {
		plant(later)
	}
	if _, err := later.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT id, state FROM idemq_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]int{}
	for rows.Next() {
		var id string
		var state int
		if err := rows.Scan(&id, &state); err != nil {
			t.Fatal(err)
		}
		left[id] = state
	}
	return left
}

// A partition is dropped only when it holds no pending or parked row.
func TestPartitionDropKeepsPendingAndParked(t *testing.T) {
	left := dropLeaves(t, nil)
	if left["pending"] != 0 || left["parked"] != 2 || len(left) != 3 {
		t.Fatalf("rows left %v, want pending (0), parked (2) and sent", left)
	}
	t.Run("naive", func(t *testing.T) {
		if left := dropLeaves(t, outbox.PlantNaiveDrop); len(left) != 0 {
			t.Fatalf("the drop by age left %v: the test above would not catch it", left)
		}
	})
}

// Once its last needed row is sent and past the retention, a partition is
// dropped, and the maintenance of two relays at once fails neither.
func TestPartitionMaintenanceConcurrent(t *testing.T) {
	ctx := context.Background()
	pool := newPartitionedPool(t, outbox.Message{ID: "x", Destination: "d"})
	first := partitions(t, pool)
	base := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 2 {
		wg.Go(func() {
			for d := range 10 {
				r := partitionedRelay(t, pool, &recorder{}, base.AddDate(0, 0, d/2+i))
				if _, err := r.Cleanup(ctx); err != nil {
					errs <- fmt.Errorf("relay %d, day +%d: %w", i, d/2+i, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := partitions(t, pool); !slices.Contains(got, first[0]) {
		t.Fatalf("partitions %v lost %s, which holds a pending row", got, first[0])
	}
	execPG(t, pool, `UPDATE idemq_outbox SET state = 1, sent_at = now()`)
	r := partitionedRelay(t, pool, &recorder{}, base.AddDate(0, 0, 9))
	if _, err := r.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	u := base.AddDate(0, 0, 9).UTC()
	want := []string{"idemq_outbox_p" + u.Format("20060102"), "idemq_outbox_p" + u.AddDate(0, 0, 1).Format("20060102"), "idemq_outbox_p" + u.AddDate(0, 0, 2).Format("20060102")}
	if got := partitions(t, pool); !slices.Equal(got, want) {
		t.Fatalf("partitions %v, want %v", got, want)
	}
	// The sequence outlived the first partition.
	execPG(t, pool, `INSERT INTO idemq_outbox (id, destination, body, created_at) VALUES ('y', 'd', '', now() + interval '9 days')`)
}

// A reply's id stays one row when its first row is in another day's
// partition, and when two replies to it race.
func TestPartitionedReplyOnce(t *testing.T) {
	ctx := context.Background()
	pool := newPartitionedPool(t)
	if _, err := partitionedRelay(t, pool, &recorder{}, time.Now()).Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	msg := &consumer.Message{ReplyTo: "replies"}
	put := func(tx outbox.PgxQuerier, id string) error {
		return outbox.PutReply(ctx, tx, "", id, msg, []byte("r"))
	}
	inTx := func(id string) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := put(tx, id); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	count := func(id string) (n int) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemq_outbox WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	inTx("req1")
	execPG(t, pool, `UPDATE idemq_outbox SET created_at = now() + interval '2 days', state = 1, sent_at = now() WHERE id = 'req1'`)
	inTx("req1")
	if n := count("req1"); n != 1 {
		t.Fatalf("reply req1 across a day boundary: %d rows, want 1", n)
	}
	var state int
	if err := pool.QueryRow(ctx, `SELECT state FROM idemq_outbox WHERE id = 'req1'`).Scan(&state); err != nil || state != 0 {
		t.Fatalf("reply req1 state %d (%v), want re-armed (0)", state, err)
	}

	// Two at once: the second waits for the first's commit.
	a, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback(ctx)
	if err := put(a, "req2"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		inTx("req2")
	}()
	// Give the second reply time to reach the lock (or, without it, to
	// commit a row of its own).
	for range 100 {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		default:
			if !waiting {
				time.Sleep(10 * time.Millisecond)
				continue
			}
		}
		break
	}
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if n := count("req2"); n != 1 {
		t.Fatalf("two replies req2 at once: %d rows, want 1", n)
	}
}

// Migration 003's Down makes the table unpartitioned again with every row,
// in order.
func TestPartitionedMigrationDown(t *testing.T) {
	ctx := context.Background()
	pool := newPartitionedPool(t, outbox.Message{ID: "old", Destination: "d"})
	r := partitionedRelay(t, pool, &recorder{}, time.Now())
	if _, err := r.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	insertPG(t, pool, outbox.Message{ID: "new", Destination: "d"})
	execPG(t, pool, `UPDATE idemq_outbox SET created_at = now() + interval '2 days' WHERE id = 'new'`)
	m, err := migrate.NewPgx(pool, migrate.Config{Line: migrate.Outbox, Partitioned: true})
	if err != nil {
		t.Fatal(err)
	}
	down := m.AllVersions()[2]
	if down.Version != 3 {
		t.Fatalf("third migration is %d, want 3", down.Version)
	}
	execPG(t, pool, down.Down)
	var kind string
	var rows int
	if err := pool.QueryRow(ctx, `SELECT relkind::text, (SELECT count(*) FROM idemq_outbox) FROM pg_class WHERE oid = 'idemq_outbox'::regclass`).Scan(&kind, &rows); err != nil {
		t.Fatal(err)
	}
	if kind != "r" || rows != 2 {
		t.Fatalf("after 003's Down: relkind %q, %d rows; want r, 2", kind, rows)
	}
	insertPG(t, pool, outbox.Message{ID: "after", Destination: "d"})
	rec := &recorder{}
	drain(t, partitionedRelay(t, pool, rec, time.Now()))
	if got, want := rec.ids(), []string{"old", "new", "after"}; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
}
