package amqpsource_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/amqpsource"
)

// A worker that credits accounts from the "payments" queue, each payment once.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/app?pool_max_conns=8")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{})
	if err != nil {
		log.Fatal(err)
	}

	rc := consumer.Config{Name: "payments", Concurrency: 4, BatchSize: 50}
	src, err := amqpsource.New(ctx, amqpsource.Config{
		URL:                "amqp://guest:guest@127.0.0.1:5672/",
		Queue:              "payments",
		Prefetch:           amqpsource.PrefetchFor(rc), // 2 × 4 × 50
		PartitionKeyHeader: "account",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	rc.KeyFunc = consumer.RequireKey // a message without a key is dead-lettered with a clear reason

	type payment struct {
		Account int   `json:"account"`
		Amount  int64 `json:"amount"`
	}
	credit := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, p payment) error {
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, p.Amount, p.Account)
		return err
	})
	r, err := consumer.NewRunner(src, consumer.Transactional(store, credit), rc)
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil { // until SIGINT or SIGTERM, then drain
		log.Fatal(err)
	}
}

// Declaring the queue, its dead-letter queue and a binding, for a quick start.
func ExampleTopology() {
	src, err := amqpsource.New(context.Background(), amqpsource.Config{
		URL:   "amqp://guest:guest@127.0.0.1:5672/",
		Queue: "orders",
		Declare: &amqpsource.Topology{
			QueueType:     amqpsource.QueueTypeQuorum,
			DeliveryLimit: 10,
			Exchange:      "shop",
			BindingKeys:   []string{"order.created"},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	// Dead letters go to the queue "orders.dlq" (amqpsource.DeadLetterQueue),
	// retries wait in "orders.retry.<delay>".
}
