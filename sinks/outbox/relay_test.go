package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
)

// recorder is a Publisher that records what it was given and fails the
// messages fail says.
type recorder struct {
	mu   sync.Mutex
	got  []outbox.Message
	fail func(m outbox.Message) error
}

func (r *recorder) Publish(_ context.Context, msgs []outbox.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := make([]error, len(msgs))
	failed := false
	for i, m := range msgs {
		if r.fail != nil {
			errs[i] = r.fail(m)
		}
		if errs[i] != nil {
			failed = true
			continue
		}
		r.got = append(r.got, m)
	}
	if failed {
		return &outbox.BatchError{Errs: errs}
	}
	return nil
}

func (r *recorder) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, len(r.got))
	for i, m := range r.got {
		ids[i] = m.ID
	}
	return ids
}

func testConfig() outbox.Config {
	return outbox.Config{PollInterval: 20 * time.Millisecond, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxAttempts: 3}
}

func insertPG(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, m := range msgs {
		if _, err := outbox.Publish(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// drain runs RelayOnce until it claims nothing.
func drain(t *testing.T, r *outbox.Relay) {
	t.Helper()
	for range 1000 {
		n, err := r.RelayOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
	t.Fatal("relay never ran out of rows")
}

// relayUntil runs r until its counts satisfy done (within 10 s), then stops
// it.
func relayUntil(t *testing.T, r *outbox.Relay, done func(outbox.Counts) bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := r.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if done(c) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("counts %+v", c)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// A row that fails holds back the later rows of its key until it is sent
// (or parked), while other keys go on.
func TestRelayKeyWaitsForFailedRow(t *testing.T) {
	pool := newPool(t)
	insertPG(t, pool,
		outbox.Message{ID: "a1", Destination: "d", Key: "a"},
		outbox.Message{ID: "a2", Destination: "d", Key: "a"},
		outbox.Message{ID: "b1", Destination: "d", Key: "b"},
	)
	failures := 0
	pub := &recorder{fail: func(m outbox.Message) error {
		if m.ID == "a1" && failures < 2 {
			failures++
			return errors.New("refused")
		}
		return nil
	}}
	cfg := testConfig()
	cfg.InitialBackoff, cfg.MaxBackoff = 50*time.Millisecond, 50*time.Millisecond
	r, err := outbox.NewRelay(pool, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RelayOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(pub.ids()); got != "[b1]" {
		t.Fatalf("after a1 failed: published %s, want [b1] (a2 waits for a1)", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(pub.ids()) < 3 && time.Now().Before(deadline) {
		if _, err := r.RelayOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := fmt.Sprint(pub.ids()); got != "[b1 a1 a2]" {
		t.Fatalf("published %s, want [b1 a1 a2]", got)
	}
	c, err := r.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.Sent != 3 || c.Pending != 0 || c.Parked != 0 {
		t.Fatalf("counts %+v", c)
	}
}

// Sent rows are kept for Retention and then deleted by Cleanup; with a
// negative Retention they are deleted when sent.
func TestRelayRetention(t *testing.T) {
	for _, d := range []string{"postgres", "sqlite"} {
		t.Run(d, func(t *testing.T) {
			ctx := context.Background()
			var relay func(outbox.Config) *outbox.Relay
			var insert func(msgs ...outbox.Message)
			switch d {
			case "postgres":
				pool := newPool(t)
				relay = func(cfg outbox.Config) *outbox.Relay { r, _ := outbox.NewRelay(pool, &recorder{}, cfg); return r }
				insert = func(msgs ...outbox.Message) { insertPG(t, pool, msgs...) }
			case "sqlite":
				db := newSQLite(t)
				relay = func(cfg outbox.Config) *outbox.Relay { r, _ := outbox.NewSQLiteRelay(db, &recorder{}, cfg); return r }
				insert = func(msgs ...outbox.Message) { insertSQL(t, db, msgs...) }
			}
			insert(outbox.Message{ID: "r1", Destination: "d"}, outbox.Message{ID: "r2", Destination: "d"})
			cfg := testConfig()
			cfg.Retention = time.Hour
			r := relay(cfg)
			drain(t, r)
			if n, err := r.Cleanup(ctx); err != nil || n != 0 {
				t.Fatalf("cleanup within retention deleted %d, %v", n, err)
			}
			cfg.Retention = time.Millisecond
			r = relay(cfg)
			time.Sleep(5 * time.Millisecond)
			if n, err := r.Cleanup(ctx); err != nil || n != 2 {
				t.Fatalf("cleanup after retention deleted %d, %v; want 2", n, err)
			}

			cfg.Retention = -1
			r = relay(cfg)
			insert(outbox.Message{ID: "r3", Destination: "d"})
			drain(t, r)
			if c, _ := r.Counts(ctx); c.Sent != 0 || c.Pending != 0 {
				t.Fatalf("with negative retention: counts %+v, want no rows", c)
			}
		})
	}
}

// The SQLite relay publishes, retries, parks and keeps per-key order like
// the PostgreSQL one.
func TestSQLiteRelay(t *testing.T) {
	ctx := context.Background()
	db := newSQLite(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []outbox.Message{
		{ID: "a1", Destination: "d", Key: "a", Headers: map[string]string{"h": "v"}, Body: []byte("x")},
		{ID: "p1", Destination: "missing", Key: "p"},
		{ID: "a2", Destination: "d", Key: "a"},
		{ID: "p2", Destination: "d", Key: "p"},
	} {
		if _, err := outbox.PublishSQL(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	pub := &recorder{fail: func(m outbox.Message) error {
		if m.Destination == "missing" {
			return outbox.NoDestination(errors.New("no such topic"))
		}
		return nil
	}}
	r, err := outbox.NewSQLiteRelay(db, pub, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	relayUntil(t, r, func(c outbox.Counts) bool { return c.Sent == 3 && c.Parked == 1 })
	if got := fmt.Sprint(pub.ids()); got != "[a1 a2 p2]" {
		t.Fatalf("published %s, want [a1 a2 p2]", got)
	}
	if pub.got[0].Headers["h"] != "v" || string(pub.got[0].Body) != "x" {
		t.Fatalf("a1 published as %+v", pub.got[0])
	}
	var attempts int
	var lastErr sql.NullString
	if err := db.QueryRow(`SELECT attempts, last_error FROM idemq_outbox WHERE id = 'p1'`).Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if attempts != 3 || !errors.Is(outbox.NoDestination(errors.New("x")), outbox.ErrNoDestination) || lastErr.String == "" {
		t.Fatalf("parked row: attempts %d, last error %q", attempts, lastErr.String)
	}
}

// A relay that polls once an hour publishes a row committed while it is
// idle: the insert's NOTIFY wakes it.
func TestRelayWokenByNotify(t *testing.T) {
	pool := newPool(t)
	pub := &recorder{}
	cfg := testConfig()
	cfg.PollInterval = time.Hour
	r, err := outbox.NewRelay(pool, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// Let the relay find nothing and go idle, listening.
	time.Sleep(200 * time.Millisecond)
	for i := range 3 {
		id := fmt.Sprintf("n%d", i)
		insertPG(t, pool, outbox.Message{ID: id, Destination: "d"})
		deadline := time.Now().Add(30 * time.Second)
		for len(pub.ids()) < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("row %s not published: the notification did not wake the relay (published %v)", id, pub.ids())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// orderChecker is a recorder that, before it confirms a batch, checks in
// the database that no earlier row of any of the batch's keys is still
// pending: a row goes out only after its key's previous row was recorded.
type orderChecker struct {
	recorder
	pool       *pgxpool.Pool
	violations []string
}

func (o *orderChecker) Publish(ctx context.Context, msgs []outbox.Message) error {
	ids := make([]string, len(msgs))
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i], keys[i] = m.ID, m.Key
	}
	rows, err := o.pool.Query(ctx, `SELECT b.id, p.id FROM idemq_outbox p
		JOIN unnest($1::text[], $2::text[]) AS b(id, key) ON p.partition_key = b.key
		WHERE p.state = 0 AND p.id < b.id`, ids, keys)
	if err != nil {
		return outbox.Unavailable(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, earlier string
		if err := rows.Scan(&id, &earlier); err != nil {
			return outbox.Unavailable(err)
		}
		o.mu.Lock()
		o.violations = append(o.violations, id+" published while "+earlier+" was pending")
		o.mu.Unlock()
	}
	if err := rows.Err(); err != nil {
		return outbox.Unavailable(err)
	}
	return o.recorder.Publish(ctx, msgs)
}

// A running relay records a batch while it claims and publishes the next
// (and with Concurrency 2 two loops do so at once): each row is published
// only after its key's previous row was recorded, every key's rows are
// confirmed in insert order, a failed publish leaves its row pending, and
// every row ends sent. With a pool smaller than the loops could use (3
// connections: LISTEN and one batch in flight at a time besides) the
// loops wait for connections and still finish.
func TestRelayOverlapKeepsKeyOrder(t *testing.T) {
	for _, tc := range []struct {
		concurrency int
		poolSize    int // of the relay's pool; 0: pgxpool's default
	}{{1, 0}, {2, 0}, {2, 3}} {
		t.Run(fmt.Sprintf("Concurrency%d-Pool%d", tc.concurrency, tc.poolSize), func(t *testing.T) {
			concurrency := tc.concurrency
			pool, schema := newPoolSchema(t)
			relayPool := pool
			if tc.poolSize > 0 {
				u, err := testenv.WithSearchPath(testenv.DatabaseURL(t), schema)
				if err != nil {
					t.Fatal(err)
				}
				cfg, err := pgxpool.ParseConfig(u)
				if err != nil {
					t.Fatal(err)
				}
				cfg.MaxConns = int32(tc.poolSize)
				if relayPool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
					t.Fatal(err)
				}
				testenv.ClosePoolAtCleanup(t, relayPool)
			}
			const n, keys = 400, 7
			var msgs []outbox.Message
			for i := range n {
				msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("o-%05d", i), Destination: "d", Key: fmt.Sprintf("k%d", i%keys)})
			}
			insertPG(t, pool, msgs...)
			failed := map[string]bool{}
			pub := &orderChecker{pool: pool}
			pub.fail = func(m outbox.Message) error {
				// Every 13th row fails once: an attempt, the row stays
				// pending and its key waits.
				var i int
				_, _ = fmt.Sscanf(m.ID, "o-%05d", &i)
				if i%13 == 0 && !failed[m.ID] {
					failed[m.ID] = true
					return errors.New("refused")
				}
				return nil
			}
			cfg := testConfig()
			cfg.BatchSize, cfg.Concurrency, cfg.MaxAttempts = 10, concurrency, 100
			r, err := outbox.NewRelay(relayPool, pub, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			deadline := time.Now().Add(60 * time.Second)
			for {
				c, err := r.Counts(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if c.Sent == n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("counts %+v", c)
				}
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if len(pub.violations) > 0 {
				t.Fatalf("%d rows published before their key's previous row was recorded, first: %s", len(pub.violations), pub.violations[0])
			}
			perKey := map[string][]string{}
			for _, m := range pub.got {
				perKey[m.Key] = append(perKey[m.Key], m.ID)
			}
			for k := range keys {
				key := fmt.Sprintf("k%d", k)
				var want []string
				for _, m := range msgs {
					if m.Key == key {
						want = append(want, m.ID)
					}
				}
				if fmt.Sprint(perKey[key]) != fmt.Sprint(want) {
					t.Fatalf("key %s confirmed %v, want %v", key, perKey[key], want)
				}
			}
			var attempts int
			if err := pool.QueryRow(context.Background(), `SELECT sum(attempts) FROM idemq_outbox`).Scan(&attempts); err != nil {
				t.Fatal(err)
			}
			if attempts != len(failed) || len(failed) != (n+12)/13 {
				t.Fatalf("%d attempts recorded for %d failed publishes", attempts, len(failed))
			}
		})
	}
}

// batchFailer is a Publisher that fails every batch with err, confirming
// nothing, and counts the messages it was given.
type batchFailer struct {
	mu  sync.Mutex
	n   int
	err func(n int) error
}

func (b *batchFailer) Publish(_ context.Context, msgs []outbox.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n += len(msgs)
	return b.err(len(msgs))
}

// A Publisher error that is not a *BatchError applies to every message of
// the batch (the Publisher contract): a plain error counts one attempt for
// each row (MaxAttempts of them park it), an Unavailable error counts none,
// and in both cases no row is marked sent. A *BatchError shorter than the batch fails the messages it
// says nothing about. Marking such rows sent would lose their messages.
func TestRelayWholeBatchError(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         func(n int) error
		unavailable bool // RelayOnce reports ErrUnavailable, no attempt counted
	}{
		{"Plain", func(int) error { return errors.New("broker said no") }, false},
		{"Unavailable", func(int) error { return outbox.Unavailable(errors.New("dial tcp: connection refused")) }, true},
		{"WrappedUnavailable", func(int) error {
			return fmt.Errorf("publish: %w", outbox.Unavailable(errors.New("connection reset")))
		}, true},
		{"ShortBatchError", func(int) error { return &outbox.BatchError{Errs: []error{}} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			for _, st := range []struct {
				name  string
				relay func(t *testing.T, pub outbox.Publisher, cfg outbox.Config) *outbox.Relay
			}{
				{"Postgres", func(t *testing.T, pub outbox.Publisher, cfg outbox.Config) *outbox.Relay {
					pool := newPool(t)
					insertPG(t, pool, wholeBatchRows()...)
					r, err := outbox.NewRelay(pool, pub, cfg)
					if err != nil {
						t.Fatal(err)
					}
					return r
				}},
				{"SQLite", func(t *testing.T, pub outbox.Publisher, cfg outbox.Config) *outbox.Relay {
					db := newSQLite(t)
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					defer tx.Rollback()
					for _, m := range wholeBatchRows() {
						if _, err := outbox.PublishSQL(ctx, tx, m); err != nil {
							t.Fatal(err)
						}
					}
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
					r, err := outbox.NewSQLiteRelay(db, pub, cfg)
					if err != nil {
						t.Fatal(err)
					}
					return r
				}},
			} {
				t.Run(st.name, func(t *testing.T) {
					pub := &batchFailer{err: tc.err}
					cfg := testConfig()
					cfg.MaxAttempts = 3
					cfg.Logger = relaytest.Logger()
					cfg.InitialBackoff, cfg.MaxBackoff = time.Nanosecond, time.Nanosecond
					r := st.relay(t, pub, cfg)
					want := int64(len(wholeBatchRows()))
					for i := range 3 {
						n, err := r.RelayOnce(ctx)
						if n != int(want) {
							t.Fatalf("pass %d claimed %d rows, want %d", i, n, want)
						}
						c, cerr := r.Counts(ctx)
						if cerr != nil {
							t.Fatal(cerr)
						}
						// A plain error counts an attempt per row: the third parks
						// them all (MaxAttempts 3). An outage counts none.
						wantPending, wantParked := want, int64(0)
						if !tc.unavailable && i == 2 {
							wantPending, wantParked = 0, want
						}
						if c.Sent != 0 || c.Parked != wantParked || c.Pending != wantPending {
							t.Fatalf("pass %d after a whole-batch publish error (%v): counts %+v, want %d pending, %d parked, none sent",
								i, tc.err(int(want)), c, wantPending, wantParked)
						}
						if tc.unavailable != errors.Is(err, outbox.ErrUnavailable) {
							t.Fatalf("pass %d: RelayOnce returned %v; want ErrUnavailable: %t", i, err, tc.unavailable)
						}
						if !tc.unavailable && err != nil {
							t.Fatalf("pass %d: RelayOnce returned %v; want nil (the failure is the rows')", i, err)
						}
						// Retries are due at once (nanosecond backoff), so every pass
						// claims the whole batch again.
						time.Sleep(time.Millisecond)
					}
					if pub.n != 3*int(want) {
						t.Fatalf("publisher was given %d messages, want %d", pub.n, 3*want)
					}
				})
			}
		})
	}
}

// wholeBatchRows are the rows of TestRelayWholeBatchError: one per key, so
// that one claim takes all of them.
func wholeBatchRows() []outbox.Message {
	return []outbox.Message{
		{ID: "w1", Destination: "d", Key: "a"},
		{ID: "w2", Destination: "d", Key: "b"},
		{ID: "w3", Destination: "e", Key: "c"},
	}
}
