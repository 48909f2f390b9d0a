package consumertest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/consumertest"
	"github.com/idemq/idemq/dedup/pgdedup"
)

// Order is the message of the example.
type Order struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

// exampleT stands in for the *testing.T of a real test.
type exampleT struct{}

func (exampleT) Helper()                        {}
func (exampleT) Name() string                   { return "ExampleReplayTx" }
func (exampleT) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }

func databaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable"
}

// A payment handler replayed with every kind of duplicate: each order is
// charged once.
func ExampleReplayTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS consumertest_example CASCADE;
		CREATE SCHEMA consumertest_example;
		CREATE TABLE consumertest_example.ledger (order_id text NOT NULL, amount bigint NOT NULL)`); err != nil {
		panic(err)
	}
	defer pool.Exec(ctx, `DROP SCHEMA consumertest_example CASCADE`)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: "consumertest_example"})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	charge := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message, o Order) error {
		_, err := tx.Exec(ctx, `INSERT INTO consumertest_example.ledger VALUES ($1, $2)`, o.ID, o.Amount)
		return err
	})
	order := func(id string, amount int64) []byte { b, _ := json.Marshal(Order{id, amount}); return b }

	rep := consumertest.ReplayTx(exampleT{}, store, charge, []consumertest.Delivery{
		{Key: "order-1", Body: order("order-1", 100), Fault: consumertest.Redelivered},
		{Key: "order-2", Body: order("order-2", 200), Fault: consumertest.ConcurrentDuplicate},
		{Key: "order-3", Body: order("order-3", 300), Fault: consumertest.CrashAfterCommit},
		{Key: "order-4", Body: order("order-4", 400), Fault: consumertest.ProducerDuplicate},
		{Key: "order-5", Body: order("order-5", 500), FailFirst: 2},
	}, consumertest.Options{})
	rep.RequireExactlyOnce(exampleT{})

	var rows, total int64
	if err := pool.QueryRow(ctx, `SELECT count(*), sum(amount) FROM consumertest_example.ledger`).Scan(&rows, &total); err != nil {
		panic(err)
	}
	fmt.Printf("ledger rows: %d, total charged: %d\n", rows, total)
	fmt.Printf("handler calls for order-5: %d, effects: %d\n", rep.Calls["order-5"], rep.Committed["order-5"])
	// It prints (checked by TestServiceExamples: no Output line, as it needs PostgreSQL):
	// ledger rows: 5, total charged: 1500
	// handler calls for order-5: 3, effects: 1
}
