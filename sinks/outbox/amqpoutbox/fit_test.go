package amqpoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
)

// maxRows is a relay hook that keeps the largest batch published.
type maxRows struct {
	mu  sync.Mutex
	max int
}

func (h *maxRows) OnRelayPublish(_ context.Context, rows, _, _ int, _ time.Duration, _ error) {
	h.mu.Lock()
	h.max = max(h.max, rows)
	h.mu.Unlock()
}

func (h *maxRows) get() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.max
}

// checkOnce fails unless got holds each of want's ids once, and nothing
// else.
func checkOnce(t *testing.T, got []relaytest.Got, want []string) {
	t.Helper()
	seen := map[string]int{}
	for _, g := range got {
		seen[g.ID]++
	}
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("message %s arrived %d times, want once", id, seen[id])
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d messages, want %d", len(got), len(want))
	}
}

// With outbox.Schema and Config.Schema, the table lives in a schema that is
// not on the connection's search_path: Migrate creates it there, Publish
// writes there and the relay publishes from there.
func TestRelayAMQPSchema(t *testing.T) {
	ctx := context.Background()
	url := testenv.AMQPURL(t)
	_, _, queue := topology(t, url)
	dbURL := testenv.DatabaseURL(t)
	schema := outbox.Schema(testenv.Schema(t, dbURL))
	pool, err := pgxpool.New(ctx, dbURL) // default search_path: not schema
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	relaytest.MigrateOutbox(t, pool, migrate.Config{Schema: string(schema)})
	var where *string
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, pgx.Identifier{string(schema), outbox.Table}.Sanitize()).Scan(&where); err != nil {
		t.Fatal(err)
	}
	if where == nil {
		t.Fatalf("migrate with Schema %q: no table %s in the schema", schema, outbox.Table)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 5 {
		id := fmt.Sprintf("schema-%d", i)
		want = append(want, id)
		if _, err := schema.Publish(ctx, tx, outbox.Message{ID: id, Destination: "", Key: queue, Body: []byte(id)}); err != nil {
			_ = tx.Rollback(ctx)
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	cfg := relaytest.FastConfig()
	cfg.Schema = schema
	relaytest.StartRelays(t, pool, pub, 1, cfg)
	checkOnce(t, consumeAll(t, url, queue, len(want)), want)
}

// Message.RoutingKey routes through the default exchange to one queue while
// Key orders: rows of different Keys are claimed and published together,
// and each Key's rows arrive in order.
func TestRelayAMQPRoutingKey(t *testing.T) {
	url := testenv.AMQPURL(t)
	_, _, queue := topology(t, url)
	pool, _, _ := relaytest.NewPool(t)
	const n, keys = 40, 4
	msgs := relaytest.Messages("rk", "", n, keys)
	var want []string
	for i := range msgs {
		msgs[i].RoutingKey = queue
		want = append(want, msgs[i].ID)
	}
	relaytest.Insert(t, pool, msgs)
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	hook := &maxRows{}
	cfg := relaytest.FastConfig()
	cfg.Hooks = []outbox.Hook{hook}
	relaytest.StartRelays(t, pool, pub, 1, cfg)
	for deadline := time.Now().Add(relaytest.WaitTimeout); ; time.Sleep(10 * time.Millisecond) {
		c := relaytest.Counts(t, pool)
		if c.Parked > 0 {
			t.Fatalf("%d rows parked: routed with Key instead of RoutingKey?", c.Parked)
		}
		if c.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay stuck: %+v", c)
		}
	}
	got := consumeAll(t, url, queue, n)
	checkOnce(t, got, want)
	last := map[string]int{}
	for _, g := range got {
		if g.Key != queue {
			t.Fatalf("message %s routed with %q, want the queue's name %q", g.ID, g.Key, queue)
		}
		i, _ := strconv.Atoi(g.Body)
		k := msgs[i].Key
		if prev, ok := last[k]; ok && prev > i {
			t.Fatalf("key %s: message %d arrived after %d", k, i, prev)
		}
		last[k] = i
	}
	if m := hook.get(); m < 2 {
		t.Fatalf("largest published batch: %d row(s); rows of %d keys routed alike were serialised", m, keys)
	}
}

// A TransactionalBatch handler publishes one event per message through
// msg.KeyContext(ctx), without explicit ids. Producer duplicates, acks lost
// after the commit (a worker killed between commit and ack: the message
// comes back), concurrent duplicates, a batch that fails whole (bisected
// and run again) and a message that fails alone do not change the ids:
// every event arrives once on RabbitMQ.
func TestBatchHandlerPublishesOncePerMessage(t *testing.T) {
	ctx := context.Background()
	url := testenv.AMQPURL(t)
	_, _, queue := topology(t, url)
	pool, schema, _ := relaytest.NewPool(t)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 30
	b := memsource.New(memsource.Config{VisibilityTimeout: 200 * time.Millisecond, Seed: 7})
	t.Cleanup(func() { b.Close() })
	b.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Topic: "orders", Probability: 0.3, Times: 8})
	b.Inject(memsource.Fault{Kind: memsource.ConcurrentDuplicate, Topic: "orders", Probability: 0.2, Times: 5})
	for i := range n {
		m := memsource.Outgoing{Key: fmt.Sprintf("o-%02d", i), Body: []byte(strconv.Itoa(i))}
		b.Publish("orders", m)
		if i%5 == 0 {
			b.Publish("orders", m) // the producer sent it twice
		}
	}
	var mu sync.Mutex
	failedWhole, failedAlone := false, false
	h := func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		for _, m := range msgs {
			if _, err := outbox.Publish(m.KeyContext(ctx), tx, outbox.Message{Destination: "", Key: m.Key, RoutingKey: queue, Body: m.Body}); err != nil {
				return err
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			switch {
			case m.Key == "o-07" && !failedWhole && len(msgs) > 1:
				failedWhole = true
				return errors.New("the whole batch fails once")
			case m.Key == "o-13" && !failedAlone:
				failedAlone = true
				return &consumer.MessageError{Msg: m, Err: errors.New("o-13 fails once")}
			}
		}
		return nil
	}
	r, err := consumer.NewRunner(b.Source("orders"), consumer.TransactionalBatch(store, h),
		consumer.Config{Name: "batch-pub", BatchSize: 8, Retry: consumer.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, Jitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	// Fail at once if a message is dead-lettered or retried past the two
	// planned failures.
	for deadline := time.Now().Add(relaytest.WaitTimeout); ; {
		st := r.Stats()
		if dl := b.DeadLetters("orders"); len(dl) > 0 {
			t.Fatalf("%d dead letters, first %s: %s", len(dl), dl[0].Key, dl[0].Reason)
		}
		if st.Handled >= n && b.Stats("orders").Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runner stuck: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}

	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	relaytest.StartRelays(t, pool, pub, 1, relaytest.FastConfig())
	got := consumeAll(t, url, queue, n)
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("batch-pub:o-%02d/0", i))
	}
	checkOnce(t, got, want)
	mu.Lock()
	defer mu.Unlock()
	if ts := b.Stats("orders"); ts.DroppedAcks == 0 || ts.Redeliveries == 0 {
		t.Fatalf("no ack was lost or nothing came back (%+v): the test proves less than it says", ts)
	}
	if !failedWhole || !failedAlone {
		t.Fatalf("the failures did not happen (whole batch %v, alone %v): the test proves less than it says", failedWhole, failedAlone)
	}
}
