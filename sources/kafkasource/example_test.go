package kafkasource_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/kafkasource"
)

// A worker that applies every order of the "orders" topic to PostgreSQL once.
// The offset of a message is committed only after the transaction that
// recorded its key and applied its UPDATE committed.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	src, err := kafkasource.New(ctx, kafkasource.Config{
		Brokers: []string{"127.0.0.1:9092"},
		Topics:  []string{"orders"},
		GroupID: "billing",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()

	pool, err := pgxpool.New(ctx, "postgres://127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{})
	if err != nil {
		log.Fatal(err)
	}

	type order struct {
		Account string `json:"account"`
		Amount  int64  `json:"amount"`
	}
	apply := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, o order) error {
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - $1 WHERE id = $2`, o.Amount, o.Account)
		return err
	})
	runner, err := consumer.NewRunner(src, consumer.Transactional(store, apply), consumer.Config{
		Name:      "billing",
		BatchSize: 100,
		// Dead-letter orders without an idempotency-key header instead of
		// deduplicating them on their offset.
		KeyFunc: consumer.RequireKey,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := runner.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
