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
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/memsource"
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
			broker.Inject(memsource.Fault{Kind: memsource.FaultDuplicate, Probability: 0.1, Times: -1})
			broker.Inject(memsource.Fault{Kind: memsource.FaultConcurrentDuplicate, Probability: 0.1, Times: -1})
			broker.Inject(memsource.Fault{Kind: memsource.FaultDropAck, Probability: 0.05, Times: -1})

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
	t.Cleanup(pool.Close)
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
