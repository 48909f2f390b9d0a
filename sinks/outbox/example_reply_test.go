package outbox_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sources/amqpsource"
)

// A worker answers charge requests on RabbitMQ: a request with the
// reply_to and correlation_id properties gets the charge's id on its reply
// queue, sent through the outbox, so the reply exists if and only if the
// charge committed. A repeated request gets the same reply again (same id,
// same body) from the Resender, without charging twice.
func ExampleReply() {
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

	charge := outbox.Reply(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO charges (request) VALUES ($1) RETURNING id`, msg.Key).Scan(&id)
		return []byte(strconv.FormatInt(id, 10)), err // the reply's body, stored with the record
	})
	resend, err := outbox.NewResender(pool, outbox.ResendConfig{})
	if err != nil {
		log.Fatal(err)
	}

	src, err := amqpsource.New(ctx, amqpsource.Config{URL: "amqp://127.0.0.1:5672/", Queue: "charge-requests"})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	runner, err := consumer.NewRunner(src, consumer.Transactional(store, charge),
		consumer.Config{Name: "charges", Hooks: []consumer.Hook{resend}})
	if err != nil {
		log.Fatal(err)
	}

	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: "amqp://127.0.0.1:5672/"})
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
