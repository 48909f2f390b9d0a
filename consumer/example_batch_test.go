package consumer_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/pgdedup"
)

// A batch worker: the handler receives the batch's new payments, already
// claimed, and applies them with one set-based UPDATE, so a batch of 100
// costs a handful of round trips instead of one per message. Duplicates
// never reach it, and a body that does not decode is dead-lettered alone.
func ExampleTransactionalBatch() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS consumer_batch_example CASCADE;
		CREATE SCHEMA consumer_batch_example;
		CREATE TABLE consumer_batch_example.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO consumer_batch_example.accounts VALUES (1, 0), (2, 0)`); err != nil {
		panic(err)
	}
	defer pool.Exec(context.Background(), `DROP SCHEMA consumer_batch_example CASCADE`)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: "consumer_batch_example"})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	broker := memsource.New(memsource.Config{})
	for i := range 10 {
		body := fmt.Sprintf(`{"account":%d,"amount":%d}`, i%2+1, 100)
		broker.Publish("payments", memsource.Outgoing{Key: fmt.Sprint("pay-", i), Body: []byte(body)})
	}
	broker.Publish("payments", memsource.Outgoing{Key: "pay-3", Body: []byte(`{"account":2,"amount":100}`)}) // producer retry
	broker.Publish("payments", memsource.Outgoing{Key: "pay-x", Body: []byte(`{not json`)})
	src := broker.Source("payments")
	defer src.Close()

	credit := consumer.TxBatchJSON(func(ctx context.Context, tx pgx.Tx, items []consumer.BatchItem[Payment]) error {
		ids, amounts := make([]int32, len(items)), make([]int64, len(items))
		for i, it := range items {
			ids[i], amounts[i] = int32(it.Value.Account), it.Value.Amount
		}
		_, err := tx.Exec(ctx, `UPDATE consumer_batch_example.accounts a SET balance = a.balance + u.amount
			FROM (SELECT id, sum(amount) AS amount FROM unnest($1::int[], $2::bigint[]) AS u(id, amount) GROUP BY id) u
			WHERE a.id = u.id`, ids, amounts)
		return err
	})
	runner, err := consumer.NewRunner(src, consumer.TransactionalBatch(store, credit),
		consumer.Config{Name: "billing", BatchSize: 100, Concurrency: 1})
	if err != nil {
		panic(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()
	for st := runner.Stats(); st.Handled+st.Duplicates+st.DeadLettered < 12; st = runner.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		panic(err)
	}

	var b1, b2 int64
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT balance FROM consumer_batch_example.accounts WHERE id = 1),
		(SELECT balance FROM consumer_batch_example.accounts WHERE id = 2)`).Scan(&b1, &b2); err != nil {
		panic(err)
	}
	st := runner.Stats()
	fmt.Printf("balances: %d %d\n", b1, b2)
	fmt.Printf("handled %d, duplicates %d, dead-lettered %d\n", st.Handled, st.Duplicates, st.DeadLettered)
	// It prints (checked by TestServiceExamples: no Output line, as it needs PostgreSQL):
	// balances: 500 500
	// handled 10, duplicates 1, dead-lettered 1
}
