package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/pgdedup"
)

// Payment is the body of a payment message.
type Payment struct {
	Account int   `json:"account"`
	Amount  int64 `json:"amount"`
}

// A worker on the transactional path: the handler's UPDATE and the
// message's record commit in one PostgreSQL transaction, and the broker is
// acknowledged after the commit. The broker here delivers one payment twice
// and the producer sends another twice; each is applied once.
func ExampleTransactional() {
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
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS consumer_example CASCADE;
		CREATE SCHEMA consumer_example;
		CREATE TABLE consumer_example.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO consumer_example.accounts VALUES (1, 0), (2, 0)`); err != nil {
		panic(err)
	}
	defer pool.Exec(context.Background(), `DROP SCHEMA consumer_example CASCADE`)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: "consumer_example"})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	broker := memsource.New(memsource.Config{})
	ids := broker.Publish("payments",
		memsource.Outgoing{Key: "pay-1", Body: []byte(`{"account":1,"amount":500}`)},
		memsource.Outgoing{Key: "pay-2", Body: []byte(`{"account":2,"amount":700}`)},
		memsource.Outgoing{Key: "pay-2", Body: []byte(`{"account":2,"amount":700}`)}, // producer retry
	)
	broker.Inject(memsource.Fault{Kind: memsource.Redelivered, ID: ids[0]}) // broker redelivery
	src := broker.Source("payments")
	defer src.Close()

	credit := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message, p Payment) error {
		if p.Amount <= 0 {
			return consumer.Permanent(errors.New("amount must be positive"))
		}
		_, err := tx.Exec(ctx, `UPDATE consumer_example.accounts SET balance = balance + $1 WHERE id = $2`, p.Amount, p.Account)
		return err
	})
	runner, err := consumer.NewRunner(src, consumer.Transactional(store, credit), consumer.Config{Name: "billing"})
	if err != nil {
		panic(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()
	for st := runner.Stats(); st.Handled+st.Duplicates < 4; st = runner.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		panic(err)
	}

	var b1, b2 int64
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT balance FROM consumer_example.accounts WHERE id = 1),
		(SELECT balance FROM consumer_example.accounts WHERE id = 2)`).Scan(&b1, &b2); err != nil {
		panic(err)
	}
	st := runner.Stats()
	fmt.Printf("balances: %d %d\n", b1, b2)
	fmt.Printf("handled %d, duplicates %d\n", st.Handled, st.Duplicates)
	// It prints (checked by TestServiceExamples: no Output line, as it needs PostgreSQL):
	// balances: 500 700
	// handled 2, duplicates 2
}
