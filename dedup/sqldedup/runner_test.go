package sqldedup_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/testenv"
)

type payment struct {
	Order  string `json:"order"`
	Amount int64  `json:"amount"`
}

// TestRunnerEffectsOnce drives the consumer runner over an at-least-once
// broker that duplicates, redelivers concurrently and loses acks, with two
// competing runners and handlers that fail their first attempt, and checks
// the effect rows: exactly one per message.
func TestRunnerEffectsOnce(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			store, db := open(t, sqldedup.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			payments := `"payments"`
			if c := store.Config(); c.Dialect == sqldedup.Postgres {
				payments = `"` + c.Schema + `"."payments"`
			}
			// No unique constraint: a second run of a handler would show
			// up as a second row.
			if _, err := db.ExecContext(ctx, `CREATE TABLE `+payments+` (order_id TEXT NOT NULL, amount BIGINT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			insert := `INSERT INTO ` + payments + ` (order_id, amount) VALUES (?1, ?2)`
			if store.Config().Dialect == sqldedup.Postgres {
				insert = `INSERT INTO ` + payments + ` (order_id, amount) VALUES ($1, $2)`
			}

			broker := memsource.New(memsource.Config{VisibilityTimeout: 500 * time.Millisecond, Seed: 7})
			const n = 300
			var want int64
			for i := range n {
				p := payment{Order: fmt.Sprintf("o-%03d", i), Amount: int64(i + 1)}
				want += p.Amount
				body, _ := json.Marshal(p)
				broker.Publish("payments", memsource.Outgoing{Key: p.Order, Body: body})
				if i%10 == 0 { // a producer retry: same key, same body
					broker.Publish("payments", memsource.Outgoing{Key: p.Order, Body: body})
				}
			}
			broker.Publish("payments", memsource.Outgoing{Key: "bad", Body: []byte("{not json")})
			broker.Inject(memsource.Fault{Kind: memsource.Redelivered, Probability: 0.1, Times: -1})
			broker.Inject(memsource.Fault{Kind: memsource.ConcurrentDuplicate, Probability: 0.1, Times: -1})
			broker.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Probability: 0.05, Times: -1})

			var calls atomic.Int64
			handle := consumer.TxJSON(func(ctx context.Context, tx *sql.Tx, msg *consumer.Message, p payment) error {
				calls.Add(1)
				if _, err := tx.ExecContext(ctx, insert, p.Order, p.Amount); err != nil {
					return err
				}
				if msg.Attempt == 1 && p.Amount%7 == 0 {
					return errors.New("flaky downstream") // rolls back the row and the record
				}
				return nil
			})
			cfg := consumer.Config{
				Name: "payments", Concurrency: 3, BatchSize: 8, DrainTimeout: 5 * time.Second,
				Retry: consumer.RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond},
			}
			runCtx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			for range 2 {
				src := broker.Source("payments")
				runner, err := consumer.NewRunner(src, consumer.Transactional(store, handle), cfg)
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() {
					if err := runner.Run(runCtx); err != nil {
						t.Errorf("Run: %v", err)
					}
					src.Close()
				})
			}
			for broker.Stats("payments").Pending > 0 && ctx.Err() == nil {
				time.Sleep(20 * time.Millisecond)
			}
			stop()
			wg.Wait()
			if ctx.Err() != nil {
				t.Fatalf("messages still pending when the test timed out: %+v", broker.Stats("payments"))
			}

			var rows, distinct, sum int64
			if err := db.QueryRowContext(testCtx(t), `SELECT count(*), count(DISTINCT order_id), coalesce(sum(amount), 0) FROM `+payments).
				Scan(&rows, &distinct, &sum); err != nil {
				t.Fatal(err)
			}
			st := broker.Stats("payments")
			t.Logf("%d handler calls, broker %+v", calls.Load(), st)
			if rows != n || distinct != n || sum != want {
				t.Fatalf("payments: %d rows, %d distinct orders, sum %d; want %d, %d, %d", rows, distinct, sum, n, n, want)
			}
			if st.Pending != 0 || st.DeadLettered != 1 {
				t.Fatalf("broker: %d pending, %d dead-lettered; want 0 and 1 (the malformed body)", st.Pending, st.DeadLettered)
			}
			if st.Deliveries <= uint64(n+n/10+1) {
				t.Fatalf("only %d deliveries: the faults did not fire, so the test proves nothing", st.Deliveries)
			}
		})
	}
}

// TestSharesTableWithPgdedup: a PostgreSQL table migrated and written by
// dedup/pgdedup deduplicates sqldedup's claims and the other way round.
func TestSharesTableWithPgdedup(t *testing.T) {
	db, schema := postgres(t)
	ctx := testCtx(t)
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	pg, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	store := migrated(t, db, sqldedup.Config{Dialect: sqldedup.Postgres, Schema: schema}) // sees pgdedup's version
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // released if the test fails first; a no-op after Commit
	if _, err := pg.MarkProcessedTx(ctx, tx, "s", "by-pgdedup", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := claimCommit(t, store, "s", rec("by-pgdedup", "x"), rec("by-sqldedup", "y"))
	if got[0].State != dedup.StateDone || got[1].State != dedup.StateNew {
		t.Fatalf("sqldedup claims = %v, %v; want done (pgdedup's record), new", got[0].State, got[1].State)
	}
	e, err := pg.Inspect(ctx, "s", "by-sqldedup")
	if err != nil || e.PayloadHash != dedup.HashPayload([]byte("y")) {
		t.Fatalf("pgdedup.Inspect of sqldedup's record = %+v, %v", e, err)
	}
	se, err := store.Inspect(ctx, "s", "by-sqldedup")
	if err != nil || !se.ProcessedAt.Equal(e.ProcessedAt) || !se.ExpiresAt.Equal(e.ExpiresAt) {
		t.Fatalf("times read by sqldedup %v/%v differ from pgdedup's %v/%v (%v)", se.ProcessedAt, se.ExpiresAt, e.ProcessedAt, e.ExpiresAt, err)
	}
}

// A failing handler in a savepoint-free batch leaves none of its writes and
// none of its record committed, while the rest of the batch commits: on
// SQLite and on PostgreSQL through database/sql.
func TestBatchFailureDropsOnlyTheCulprit(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			store, db := open(t, sqldedup.Config{})
			ctx := testCtx(t)
			effects := `"effects"`
			insert := `INSERT INTO "effects" (k) VALUES (?1)`
			if c := store.Config(); c.Dialect == sqldedup.Postgres {
				effects = `"` + c.Schema + `"."effects"`
				insert = `INSERT INTO ` + effects + ` (k) VALUES ($1)`
			}
			if _, err := db.ExecContext(ctx, `CREATE TABLE `+effects+` (k TEXT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			broker := memsource.New(memsource.Config{VisibilityTimeout: time.Second})
			defer broker.Close()
			var keys []string
			for i := range 8 {
				k := fmt.Sprintf("k%d", i)
				keys = append(keys, k)
				broker.Publish("t", memsource.Outgoing{Key: k, Body: []byte(k)})
			}
			var mu sync.Mutex
			calls := map[string]int{}
			handle := func(ctx context.Context, tx *sql.Tx, msg *consumer.Message) error {
				mu.Lock()
				calls[msg.Key]++
				mu.Unlock()
				if _, err := tx.ExecContext(ctx, insert, msg.Key); err != nil {
					return err
				}
				if msg.Key == "k3" {
					return errors.New("fails after its write")
				}
				return nil
			}
			src := broker.Source("t")
			runner, err := consumer.NewRunner(src, consumer.Transactional(store, handle), consumer.Config{
				Name: "t", Concurrency: 1, BatchSize: 8,
				Retry: consumer.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond},
			})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- runner.Run(runCtx) }()
			for broker.Stats("t").Pending > 0 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			rows, err := db.QueryContext(ctx, `SELECT k, count(*) FROM `+effects+` GROUP BY k`)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for rows.Next() {
				var k string
				var n int
				if err := rows.Scan(&k, &n); err != nil {
					t.Fatal(err)
				}
				got[k] = n
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				want := 1
				if k == "k3" {
					want = 0
				}
				if got[k] != want {
					t.Errorf("%s: %d committed effects, want %d", k, got[k], want)
				}
				_, err := store.Inspect(ctx, "t", k)
				if want == 1 && err != nil || want == 0 && !errors.Is(err, dedup.ErrNotFound) {
					t.Errorf("record of %s: %v", k, err)
				}
			}
			if dl := broker.DeadLetters("t"); len(dl) != 1 || dl[0].Key != "k3" || calls["k3"] != 1 {
				t.Fatalf("dead letters %+v after %d calls of k3: want k3 alone, after 1 call", dl, calls["k3"])
			}
		})
	}
}

// The batch API works over database/sql: one handler call per batch of new
// messages, and a culprit it does not name is found without counting the
// others.
func TestTransactionalBatch(t *testing.T) {
	for name, open := range backends() {
		t.Run(name, func(t *testing.T) {
			store, db := open(t, sqldedup.Config{})
			ctx := testCtx(t)
			effects, ph := `"effects"`, "?"
			if c := store.Config(); c.Dialect == sqldedup.Postgres {
				effects, ph = `"`+c.Schema+`"."effects"`, "$"
			}
			if _, err := db.ExecContext(ctx, `CREATE TABLE `+effects+` (k TEXT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			broker := memsource.New(memsource.Config{VisibilityTimeout: time.Second})
			defer broker.Close()
			for i := range 20 {
				broker.Publish("t", memsource.Outgoing{Key: fmt.Sprintf("k%02d", i), Body: []byte(`{}`)})
			}
			handle := func(ctx context.Context, tx *sql.Tx, msgs []*consumer.Message) error {
				q, args := `INSERT INTO `+effects+` (k) VALUES `, []any{}
				for i, m := range msgs {
					if m.Key == "k13" {
						return errors.New("a batch with k13 fails")
					}
					if i > 0 {
						q += ", "
					}
					q += fmt.Sprintf("(%s%d)", ph, i+1)
					args = append(args, m.Key)
				}
				_, err := tx.ExecContext(ctx, q, args...)
				return err
			}
			src := broker.Source("t")
			runner, err := consumer.NewRunner(src, consumer.TransactionalBatch(store, handle), consumer.Config{
				Name: "t", Concurrency: 1, BatchSize: 20,
				Retry: consumer.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond},
			})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- runner.Run(runCtx) }()
			for broker.Stats("t").Pending > 0 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			var n, distinct int
			if err := db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT k) FROM `+effects).Scan(&n, &distinct); err != nil {
				t.Fatal(err)
			}
			if n != 19 || distinct != 19 {
				t.Fatalf("%d effects (%d distinct), want 19", n, distinct)
			}
			if dl := broker.DeadLetters("t"); len(dl) != 1 || dl[0].Key != "k13" {
				t.Fatalf("dead letters %+v, want k13 alone", dl)
			}
		})
	}
}

// A handler that ends the runner's transaction itself (ROLLBACK through
// tx) on PostgreSQL through database/sql: the commit is refused, the
// earlier message's effect is not lost, and the handler is blamed.
func TestHandlerEndingTheTransactionIsRefused(t *testing.T) {
	store, db := backends()["postgres"](t, sqldedup.Config{})
	ctx := t.Context()
	table := `"` + store.Config().Schema + `"."effects"`
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (key TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	broker := memsource.New(memsource.Config{VisibilityTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = broker.Close() })
	for _, k := range []string{"a", "x"} {
		broker.Publish("t", memsource.Outgoing{Key: k, Body: []byte(k)})
	}
	h := func(ctx context.Context, tx *sql.Tx, msg *consumer.Message) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (key) VALUES ($1)`, msg.Key); err != nil {
			return err
		}
		if msg.Key == "x" {
			_, err := tx.ExecContext(ctx, `ROLLBACK`)
			return err
		}
		return nil
	}
	r, err := consumer.NewRunner(broker.Source("t"), consumer.Transactional(store, h), consumer.Config{
		Name: "ended", Concurrency: 1, BatchSize: 2, BatchWait: 500 * time.Millisecond,
		Retry: consumer.RetryPolicy{MaxAttempts: 1, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	deadline := time.Now().Add(20 * time.Second)
	for st := broker.Stats("t"); st.Ready+st.InFlight+st.Pending > 0; st = broker.Stats("t") {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("not settled: %+v (Run: %v)", st, <-done)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var dead []string
	for _, dl := range broker.DeadLetters("t") {
		dead = append(dead, dl.Key)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+table+` WHERE key = 'a'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || len(dead) != 1 || dead[0] != "x" {
		t.Fatalf("a has %d effects and the dead letters are %v; want 1 effect and [x]", n, dead)
	}
}
