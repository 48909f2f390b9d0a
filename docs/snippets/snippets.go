// Package snippets holds the Go code blocks of docs/, so that they
// compile: .ci/check-docs requires every ```go block of the documentation to
// be marked <!-- snippet: docs/snippets/snippets.go --> (or another
// compiled file) and each of its lines to be a line of that file. Nothing
// imports this package; `go vet ./...` builds it.
package snippets

import (
	"context"
	"database/sql"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/consumertest"
	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/kafkaoutbox"
	"github.com/idemq/idemq/sinks/webhook"
	"github.com/idemq/idemq/sources/kafkasource"
)

import _ "modernc.org/sqlite" // registers the "sqlite" driver

// Payment is the message body of the workers' snippets.
type Payment struct {
	Account int64 `json:"account"`
	Amount  int64 `json:"amount"`
}

// docs/workers.md: a worker on Kafka and PostgreSQL.
func worker(ctx context.Context) {
	// One connection per lane (Concurrency) plus room for queries outside the
	// lane's transaction and the janitor: NewRunner refuses a pool no larger
	// than Concurrency.
	poolCfg, _ := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	poolCfg.MaxConns = 8
	pool, _ := pgxpool.NewWithConfig(ctx, poolCfg)
	store, _ := pgdedup.New(pool, pgdedup.Config{})
	_ = store.Migrate(ctx)

	src, _ := kafkasource.New(ctx, kafkasource.Config{
		Brokers: []string{"127.0.0.1:9092"}, Topics: []string{"payments"}, GroupID: "billing",
	})
	defer src.Close()

	charge := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message, p Payment) error {
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, p.Amount, p.Account)
		return err
	})
	runner, _ := consumer.NewRunner(src, consumer.Transactional(store, charge), consumer.Config{
		Name: "billing", Concurrency: 4, BatchSize: 100, Logger: slog.Default(),
	})
	_ = runner.Run(ctx) // until ctx is cancelled: then drains, commits, acks and returns
}

// docs/workers.md: the same worker on SQLite.
func workerSQLite(ctx context.Context, src consumer.Source) {
	db, _ := sqldedup.OpenSQLite(ctx, "shop.db") // created if missing
	store, _ := sqldedup.New(db, sqldedup.Config{Dialect: sqldedup.SQLite})
	_ = store.Migrate(ctx)

	charge := consumer.TxJSON(func(ctx context.Context, tx *sql.Tx, msg *consumer.Message, p Payment) error {
		_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ?`, p.Amount, p.Account)
		return err
	})
	runner, _ := consumer.NewRunner(src, consumer.Transactional(store, charge), consumer.Config{Name: "billing"})
	_ = runner.Run(ctx)
}

// docs/workers.md: a whole batch in one statement.
func workerBatch(src consumer.Source, store dedupdriver.TxStore[pgx.Tx]) {
	credit := consumer.TxBatchJSON(func(ctx context.Context, tx pgx.Tx, items []consumer.BatchItem[Payment]) error {
		ids, amounts := make([]int32, len(items)), make([]int64, len(items))
		for i, it := range items {
			ids[i], amounts[i] = int32(it.Value.Account), it.Value.Amount
		}
		_, err := tx.Exec(ctx, `UPDATE accounts a SET balance = a.balance + u.amount
			FROM (SELECT id, sum(amount) AS amount FROM unnest($1::int[], $2::bigint[]) AS u(id, amount) GROUP BY id) u
			WHERE a.id = u.id`, ids, amounts)
		return err
	})
	runner, _ := consumer.NewRunner(src, consumer.TransactionalBatch(store, credit), consumer.Config{Name: "billing", BatchSize: 100})
	_ = runner
}

// docs/testing.md: replaying a handler.
func replay(t consumertest.TB, store dedupdriver.TxStore[pgx.Tx], charge consumer.TxHandler[pgx.Tx], order1, order2, order3 []byte) {
	rep := consumertest.ReplayTx(t, store, charge, []consumertest.Delivery{
		{Key: "order-1", Body: order1, Fault: consumertest.ConcurrentDuplicate},
		{Key: "order-2", Body: order2, Fault: consumertest.CrashAfterCommit},
		{Key: "order-3", Body: order3, FailFirst: 2}, // its writes must roll back twice
	}, consumertest.Options{BatchSize: 10})
	rep.RequireExactlyOnce(t)
	// then check your own tables: one ledger row per order
}

// docs/observability.md: the hook.
func observe(src consumer.Source, path consumer.Path) {
	hook, _ := otelidemq.New(otelidemq.Config{ConsumerGroup: "billing"}) // global providers, or pass them
	runner, _ := consumer.NewRunner(src, path, consumer.Config{Name: "billing", Hooks: []consumer.Hook{hook}})
	_ = runner
}

// docs/observability.md: a webhook sink that follows the application's
// propagator.
func webhookTraced(url string) {
	sink, err := webhook.New(webhook.Config{URL: url, Propagator: otelidemq.Propagator()})
	_, _ = sink, err
}

// docs/outbox.md: publishing from a handler.
func publish(ctx context.Context, pool *pgxpool.Pool) {
	charge := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET charged = true WHERE id = $1`, msg.Key); err != nil {
			return err
		}
		_, err := outbox.Publish(ctx, tx, outbox.Message{Destination: "orders-charged", Key: msg.Key, Body: msg.Body})
		return err
	}
	pub, _ := kafkaoutbox.New(kafkaoutbox.Config{Brokers: []string{"127.0.0.1:9092"}})
	relay, _ := outbox.NewRelay(pool, pub, outbox.Config{}) // outbox.NewSQLiteRelay(db, ...) on SQLite
	go func() {
		if err := relay.Run(ctx); err != nil {
			slog.ErrorContext(ctx, "outbox relay stopped", "err", err)
		}
	}()
	_ = charge
}

// docs/outbox.md: a schema, a routing key and a batch handler.
func publishBatch(ctx context.Context, pool *pgxpool.Pool, pub outbox.Publisher) {
	billing := outbox.Schema("billing") // the table lives in schema billing, whatever the search_path
	m, _ := migrate.NewPgx(pool, migrate.Config{Line: migrate.Outbox, Schema: string(billing)})
	_, _ = m.Migrate(ctx) // idemq migrate --outbox --schema billing
	chargeAll := func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		for _, m := range msgs {
			// m.KeyContext(ctx) carries m's IdempotencyKey: each event gets m's stable id.
			ev := outbox.Message{Destination: "", RoutingKey: "orders-charged", Key: m.Key, Body: m.Body}
			if _, err := billing.Publish(m.KeyContext(ctx), tx, ev); err != nil {
				return err
			}
		}
		return nil
	}
	relay, _ := outbox.NewRelay(pool, pub, outbox.Config{Schema: billing}) // idemq relay --schema billing
	go func() {
		if err := relay.Run(ctx); err != nil {
			slog.ErrorContext(ctx, "outbox relay stopped", "err", err)
		}
	}()
	_ = chargeAll
}
