package sqssource_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/sqssource"
)

// A worker that applies every order once: the handler's UPDATE and the
// order's dedup record commit together, and the SQS message is deleted only
// after that commit.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// Region, credentials and endpoint come from the AWS configuration
	// chain (AWS_REGION, AWS_PROFILE, AWS_ENDPOINT_URL_SQS, roles, ...).
	client, err := sqssource.NewClient(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	src, err := sqssource.New(ctx, client, sqssource.Config{
		QueueURL:           os.Getenv("QUEUE_URL"),
		DeadLetterQueueURL: os.Getenv("DEAD_LETTER_QUEUE_URL"),
		KeyAttribute:       "order-id", // producers' idempotency key, else the MessageId
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close() // after Run: releases what was received but not settled

	type order struct {
		Account int   `json:"account"`
		Amount  int64 `json:"amount"`
	}
	handle := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, o order) error {
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - $1 WHERE id = $2`, o.Amount, o.Account)
		return err
	})
	runner, err := consumer.NewRunner(src, consumer.Transactional(store, handle), consumer.Config{
		Name:      "billing",
		BatchSize: 10,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := runner.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Leaving dead letters to the queue's redrive policy: no DeadLetterQueueURL,
// and the runner retries at least as often as SQS receives before it moves a
// message, so that SQS moves poison before the runner gives up on it.
func ExampleSource_MaxReceiveCount() {
	ctx := context.Background()
	client, err := sqssource.NewClient(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	src, err := sqssource.New(ctx, client, sqssource.Config{QueueURL: os.Getenv("QUEUE_URL")})
	if err != nil {
		log.Fatal(err) // sqssource.ErrNoDeadLetterRoute if the queue has no redrive policy
	}
	defer src.Close()
	cfg := consumer.Config{
		Name:  "billing",
		Retry: consumer.RetryPolicy{MaxAttempts: src.MaxReceiveCount()},
	}
	_ = cfg
}
