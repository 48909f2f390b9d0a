package outbox_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/kafkaoutbox"
	"github.com/idemq/idemq/sources/kafkasource"
)

// A worker charges each order once and emits an "order charged" event in
// the same transaction; a relay in the same process publishes the events
// to Kafka after commit. A consumer of "orders-charged" deduplicates the
// relay's re-sends by the idempotency-key header, with no configuration.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, "postgres://127.0.0.1:5432/shop")
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
	outboxMigrator, err := migrate.NewPgx(pool, migrate.Config{Line: migrate.Outbox})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := outboxMigrator.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	charge := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET charged = true WHERE id = $1`, msg.Key); err != nil {
			return err
		}
		// Written in tx: published after the commit, never after a rollback.
		// Its id is consumer.IdempotencyKey(ctx) + "/0" on every run.
		_, err := outbox.Publish(ctx, tx, outbox.Message{
			Destination: "orders-charged",
			Key:         msg.Key,
			Body:        msg.Body,
		})
		return err
	}

	src, err := kafkasource.New(ctx, kafkasource.Config{Brokers: []string{"127.0.0.1:9092"}, Topics: []string{"orders"}, GroupID: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	runner, err := consumer.NewRunner(src, consumer.Transactional(store, charge), consumer.Config{Name: "billing"})
	if err != nil {
		log.Fatal(err)
	}

	pub, err := kafkaoutbox.New(kafkaoutbox.Config{Brokers: []string{"127.0.0.1:9092"}})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(pool, pub, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := relay.Run(ctx); err != nil {
			log.Print(err)
		}
	}()
	if err := runner.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Outside a handler, give the message an id of your own: a retry of the
// same business operation must use the same id.
func ExamplePublish_explicitID() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE invoices SET sent = true WHERE id = 7`); err != nil {
			return err
		}
		_, err := outbox.Publish(ctx, tx, outbox.Message{ID: "invoice-7-sent", Destination: "invoices", Key: "7", Body: []byte(`{"id":7}`)})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}
