package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
)

// fastRetry retries failed handlers at once.
var fastRetry = consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, Jitter: -1}

// newPool returns a pool on a fresh schema with the outbox table.
func newPool(t *testing.T) *pgxpool.Pool {
	pool, _ := newPoolSchema(t)
	return pool
}

// newPoolSchema is newPool that also returns the schema's name.
func newPoolSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	schema := testenv.Schema(t, testenv.DatabaseURL(t))
	u, err := testenv.WithSearchPath(testenv.DatabaseURL(t), schema)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	relaytest.MigrateOutbox(t, pool, migrate.Config{})
	return pool, schema
}

// newSQLite returns a SQLite database in a temporary directory with the
// outbox table.
func newSQLite(t *testing.T) *sql.DB {
	t.Helper()
	ctx := context.Background()
	db, err := sqldedup.OpenSQLite(ctx, filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	m, err := migrate.NewSQL(db, migrate.Config{Line: migrate.Outbox, Dialect: migrate.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return db
}

// handlerRun is what a publishing handler saw on one attempt.
type handlerRun struct {
	key string
	ids []string
}

// publishing returns a handler body that publishes three messages for the
// consuming message, records their ids, and fails as fail says.
func publishing(mu *sync.Mutex, runs *[]handlerRun, fail func(key string, attempt int) error) func(ctx context.Context, tx any, msg *consumer.Message) error {
	attempts := map[string]int{}
	return func(ctx context.Context, tx any, msg *consumer.Message) error {
		run := handlerRun{key: msg.Key}
		for i := range 3 {
			id, err := publishAny(ctx, tx, outbox.Message{
				Destination: "events",
				Key:         msg.Key,
				Headers:     map[string]string{"n": fmt.Sprint(i)},
				Body:        []byte(fmt.Sprintf("%s-%d", msg.Key, i)),
			})
			if err != nil {
				return err
			}
			run.ids = append(run.ids, id)
		}
		mu.Lock()
		attempts[msg.Key]++
		a := attempts[msg.Key]
		*runs = append(*runs, run)
		mu.Unlock()
		return fail(msg.Key, a)
	}
}

// publishAny publishes m in tx, a pgx or a database/sql transaction.
func publishAny(ctx context.Context, tx any, m outbox.Message) (string, error) {
	switch tx := tx.(type) {
	case outbox.PgxQuerier:
		return outbox.Publish(ctx, tx, m)
	case outbox.SQLQuerier:
		return outbox.PublishSQL(ctx, tx, m)
	}
	return "", fmt.Errorf("publish in a %T", tx)
}

// runUntil runs r until cond holds.
func runUntil(t *testing.T, r *consumer.Runner, cond func(consumer.Stats) bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !cond(r.Stats()) {
		if time.Now().After(deadline) {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			t.Fatalf("runner did not get there: %+v", r.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
}

type outboxRow struct {
	id, sourceKey, dest, key, headers, body string
}

// db abstracts the two databases for the assertions.
type rowsFunc func(t *testing.T) []outboxRow

func pgRows(pool *pgxpool.Pool) rowsFunc {
	return func(t *testing.T) []outboxRow {
		rows, err := pool.Query(context.Background(), `SELECT id, coalesce(source_key, ''), destination, partition_key, headers, body FROM idemq_outbox ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		var out []outboxRow
		for rows.Next() {
			var r outboxRow
			var body []byte
			if err := rows.Scan(&r.id, &r.sourceKey, &r.dest, &r.key, &r.headers, &body); err != nil {
				t.Fatal(err)
			}
			r.body = string(body)
			out = append(out, r)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
}

func sqlRows(db *sql.DB) rowsFunc {
	return func(t *testing.T) []outboxRow {
		rows, err := db.Query(`SELECT id, coalesce(source_key, ''), destination, partition_key, headers, body FROM idemq_outbox ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []outboxRow
		for rows.Next() {
			var r outboxRow
			var body []byte
			if err := rows.Scan(&r.id, &r.sourceKey, &r.dest, &r.key, &r.headers, &body); err != nil {
				t.Fatal(err)
			}
			r.body = string(body)
			out = append(out, r)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
}

// publishCase runs the publish tests on one database.
type publishCase struct {
	name   string
	runner func(t *testing.T, src consumer.Source, h func(ctx context.Context, tx any, msg *consumer.Message) error) *consumer.Runner
	rows   func(t *testing.T) rowsFunc
}

func publishCases() []publishCase {
	var pool *pgxpool.Pool
	var db *sql.DB
	return []publishCase{
		{
			name: "postgres",
			runner: func(t *testing.T, src consumer.Source, h func(ctx context.Context, tx any, msg *consumer.Message) error) *consumer.Runner {
				var schema string
				pool, schema = newPoolSchema(t)
				store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				if err := store.Migrate(context.Background()); err != nil {
					t.Fatal(err)
				}
				r, err := consumer.NewRunner(src, consumer.Transactional(store, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
					return h(ctx, tx, msg)
				}), consumer.Config{Name: "pub", Retry: fastRetry, BatchSize: 4})
				if err != nil {
					t.Fatal(err)
				}
				return r
			},
			rows: func(*testing.T) rowsFunc { return pgRows(pool) },
		},
		{
			name: "sqlite",
			runner: func(t *testing.T, src consumer.Source, h func(ctx context.Context, tx any, msg *consumer.Message) error) *consumer.Runner {
				db = newSQLite(t)
				store, err := sqldedup.New(db, sqldedup.Config{Dialect: sqldedup.SQLite})
				if err != nil {
					t.Fatal(err)
				}
				if err := store.Migrate(context.Background()); err != nil {
					t.Fatal(err)
				}
				r, err := consumer.NewRunner(src, consumer.Transactional(store, func(ctx context.Context, tx *sql.Tx, msg *consumer.Message) error {
					return h(ctx, tx, msg)
				}), consumer.Config{Name: "pub", Retry: fastRetry, BatchSize: 4})
				if err != nil {
					t.Fatal(err)
				}
				return r
			},
			rows: func(*testing.T) rowsFunc { return sqlRows(db) },
		},
	}
}

// A handler that publishes and then fails leaves no outbox row; its rerun
// publishes the same ids, and only the committed run's rows remain.
func TestPublishRerunSameIDs(t *testing.T) {
	for _, c := range publishCases() {
		t.Run(c.name, func(t *testing.T) {
			b := memsource.New(memsource.Config{VisibilityTimeout: 50 * time.Millisecond})
			defer b.Close()
			b.Publish("orders", memsource.Outgoing{Key: "o-1"}, memsource.Outgoing{Key: "o-2"}, memsource.Outgoing{Key: "o-3"})
			var mu sync.Mutex
			var runs []handlerRun
			// o-2 fails on its first attempt, after publishing.
			h := publishing(&mu, &runs, func(key string, attempt int) error {
				if key == "o-2" && attempt == 1 {
					return errors.New("charge declined, try again")
				}
				return nil
			})
			r := c.runner(t, b.Source("orders"), h)
			runUntil(t, r, func(s consumer.Stats) bool { return s.Handled == 3 })

			byKey := map[string][][]string{}
			for _, run := range runs {
				byKey[run.key] = append(byKey[run.key], run.ids)
			}
			if n := len(byKey["o-2"]); n < 2 {
				t.Fatalf("o-2 ran %d times, want at least 2", n)
			}
			first := fmt.Sprint(byKey["o-2"][0])
			for i, ids := range byKey["o-2"][1:] {
				if fmt.Sprint(ids) != first {
					t.Fatalf("run %d of o-2 published %v, run 1 published %s", i+2, ids, first)
				}
			}
			rows := c.rows(t)(t)
			if len(rows) != 9 {
				t.Fatalf("%d outbox rows, want 9 (3 per committed handler run): %+v", len(rows), rows)
			}
			seen := map[string]bool{}
			for _, row := range rows {
				if seen[row.id] {
					t.Fatalf("id %s twice", row.id)
				}
				seen[row.id] = true
				if row.dest != "events" || row.sourceKey == "" {
					t.Fatalf("row %+v", row)
				}
			}
			want, _ := consumerKey("pub", "o-2")
			for i := range 3 {
				id := fmt.Sprintf("%s/%d", want, i)
				if !seen[id] {
					t.Fatalf("no row with id %s in %+v", id, rows)
				}
			}
		})
	}
}

// A handler that publishes and then fails for good leaves no outbox row.
func TestPublishRollbackLeavesNoRow(t *testing.T) {
	for _, c := range publishCases() {
		t.Run(c.name, func(t *testing.T) {
			b := memsource.New(memsource.Config{VisibilityTimeout: 50 * time.Millisecond})
			defer b.Close()
			b.Publish("orders", memsource.Outgoing{Key: "o-1"})
			var mu sync.Mutex
			var runs []handlerRun
			h := publishing(&mu, &runs, func(string, int) error {
				return consumer.Permanent(errors.New("card stolen"))
			})
			r := c.runner(t, b.Source("orders"), h)
			// The message is dead-lettered (or, on a redelivery, recognised as
			// settled): either way its handler's transaction was rolled back.
			runUntil(t, r, func(s consumer.Stats) bool { return s.DeadLettered+s.Duplicates >= 1 })
			if len(runs) == 0 {
				t.Fatal("handler never ran")
			}
			if rows := c.rows(t)(t); len(rows) != 0 {
				t.Fatalf("rolled-back handler left %d outbox rows: %+v", len(rows), rows)
			}
		})
	}
}

// consumerKey is consumer.IdempotencyKey for a runner named scope.
func consumerKey(scope, key string) (string, bool) { return scope + ":" + key, true }

// Outside a handler, Publish needs an explicit id; with one, the row is
// written in the caller's transaction.
func TestPublishExplicitID(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := outbox.Publish(ctx, tx, outbox.Message{Destination: "events"}); !errors.Is(err, outbox.ErrNoID) {
		t.Fatalf("publish without id outside a handler: %v, want ErrNoID", err)
	}
	// The failed statement aborted tx; start again.
	_ = tx.Rollback(ctx)
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // released if the test fails first; a no-op after Commit
	id, err := outbox.Publish(ctx, tx, outbox.Message{ID: "invoice-7", Destination: "events", Body: []byte("x")})
	if err != nil || id != "invoice-7" {
		t.Fatalf("publish: %q, %v", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if rows := pgRows(pool)(t); len(rows) != 1 || rows[0].id != "invoice-7" || rows[0].sourceKey != "" {
		t.Fatalf("rows %+v", rows)
	}
}

// A publish from a traced handler carries the handler's span as a
// traceparent header; a traceparent the caller set is kept; without a span
// none is added.
func TestPublishCarriesTraceparent(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	traced := trace.ContextWithSpanContext(ctx, sc)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, p := range []struct {
		ctx context.Context
		m   outbox.Message
	}{
		{traced, outbox.Message{ID: "traced", Destination: "events", Headers: map[string]string{"a": "1"}}},
		{traced, outbox.Message{ID: "own", Destination: "events", Headers: map[string]string{"traceparent": "mine"}}},
		{ctx, outbox.Message{ID: "plain", Destination: "events"}},
	} {
		if _, err := outbox.Publish(p.ctx, tx, p.m); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"traced": `{"a":"1","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
		"own":    `{"traceparent":"mine"}`,
		"plain":  `{}`,
	}
	for id, w := range want {
		var got string
		if err := pool.QueryRow(ctx, `SELECT headers::text FROM `+outbox.Table+` WHERE id = $1`, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != w {
			t.Errorf("row %s: headers %s, want %s", id, got, w)
		}
	}
}
