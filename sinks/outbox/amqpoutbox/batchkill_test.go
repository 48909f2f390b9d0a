package amqpoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sources/amqpsource"
)

// Environment of the batch worker child process.
const (
	batchWorkerEnv   = "IDEMQ_BATCH_KILL_WORKER" // "1" in the child
	batchDBEnv       = "IDEMQ_BATCH_KILL_DB"
	batchSchemaEnv   = "IDEMQ_BATCH_KILL_SCHEMA"
	batchQueueEnv    = "IDEMQ_BATCH_KILL_QUEUE"
	batchExchangeEnv = "IDEMQ_BATCH_KILL_EXCHANGE"

	// batchLongEnv set to 1 runs the long mode: more messages and more
	// kills (make test-batch-kill-long).
	batchLongEnv = "IDEMQ_BATCH_KILL_LONG"
)

// batchWorkerName is the worker's consumer.Config.Name: the scope of the
// idempotency keys its events' stable ids start with.
const batchWorkerName = "batch-kill"

// batchWorkerBatch is the worker's BatchSize.
const batchWorkerBatch = 20

// exitNoKey is the exit code of a worker whose outbox.Publish found no key
// in its context: a defect the test reports at once instead of waiting for
// retries and dead letters.
const exitNoKey = 3

// TestHelperBatchWorkerChild is the worker process of
// TestBatchHandlerPublishesUnderKills: a TransactionalBatch handler over
// pgdedup that, in one transaction per batch, inserts one business row per
// message and publishes one outbox event per message through
// m.KeyContext(ctx). It records every duplicate it absorbs in the dups
// table. It does nothing when run on its own.
func TestHelperBatchWorkerChild(t *testing.T) {
	if os.Getenv(batchWorkerEnv) != "1" {
		t.Skip("helper process of TestBatchHandlerPublishesUnderKills")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // never outlive the parent by much
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv(batchDBEnv))
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: os.Getenv(batchSchemaEnv)})
	if err != nil {
		t.Fatal(err)
	}
	queue := os.Getenv(batchQueueEnv)
	src, err := amqpsource.New(ctx, amqpsource.Config{URL: testenv.AMQPURL(t), Queue: queue, Prefetch: 2 * batchWorkerBatch, Logger: relaytest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	exchange := os.Getenv(batchExchangeEnv)
	h := func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		keys, bodies := make([]string, len(msgs)), make([]string, len(msgs))
		for i, m := range msgs {
			keys[i], bodies[i] = m.Key, string(m.Body)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO applied (msg_key, body) SELECT * FROM unnest($1::text[], $2::text[])`, keys, bodies); err != nil {
			return err
		}
		for _, m := range msgs {
			_, err := outbox.Publish(m.KeyContext(ctx), tx, outbox.Message{Destination: exchange, Key: "k-" + m.Key[len(m.Key)-1:], Body: m.Body})
			if errors.Is(err, outbox.ErrNoID) {
				fmt.Fprintf(os.Stderr, "worker: %v\n", err)
				os.Exit(exitNoKey)
			}
			if err != nil {
				return err
			}
		}
		// Hold the transaction open a little, so that the parent's kills
		// land inside transactions as well as between commit and ack.
		select {
		case <-time.After(time.Duration(5+rand.IntN(40)) * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r, err := consumer.NewRunner(src, consumer.TransactionalBatch(store, h), consumer.Config{
		Name: batchWorkerName, BatchSize: batchWorkerBatch, Logger: relaytest.Logger(),
		Retry: consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Jitter: -1},
		Hooks: []consumer.Hook{dupRecorder{pool}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// dupRecorder records every duplicate the worker absorbs, with the runner's
// guess of its reason, so that the parent can count them across kills.
type dupRecorder struct{ pool *pgxpool.Pool }

func (d dupRecorder) OnClaimed(ctx context.Context, m *consumer.Message, c consumer.ClaimInfo) {
	if c.State == dedup.StateDone {
		_, _ = d.pool.Exec(context.WithoutCancel(ctx), `INSERT INTO dups (msg_key, reason) VALUES ($1, $2)`, m.Key, c.Reason.String())
	}
}

// batchKillSize is the number of messages, worker kills and relay kills.
func batchKillSize() (n, workerKills, relayKills int) {
	if os.Getenv(batchLongEnv) == "1" {
		return 3000, 30, 30
	}
	return 300, 6, 5
}

// TestBatchHandlerPublishesUnderKills proves that a
// TransactionalBatch handler can publish through the outbox: a producer
// sends n messages (one in ten twice) to a RabbitMQ queue; a worker process
// (TestHelperBatchWorkerChild) handles them in batches of 20, inserting one
// business row and publishing one outbox event per message with
// outbox.Publish(m.KeyContext(ctx), tx, ...) in the batch's transaction. The
// test SIGKILLs the worker at random moments and restarts it until every
// message is handled; then relay processes are SIGKILLed between the
// publisher confirm and the row update (relaytest.RunKills), a last relay
// sends the rest, and an idemq consumer downstream (relaytest.Downstream)
// applies each event. Every message must have exactly one business row and
// exactly one outbox row whose id is the message's stable id
// ("batch-kill:<key>/0"), and every event must take effect downstream
// exactly once, none missing.
//
// IDEMQ_BATCH_KILL_LONG=1 (make test-batch-kill-long) runs ten times the
// messages and more kills.
func TestBatchHandlerPublishesUnderKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; skipped with -short")
	}
	n, workerKills, relayKills := batchKillSize()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 26))
	t.Logf("%d messages; kills: worker %d, relay %d; seed %d", n, workerKills, relayKills, seed)
	ctx := context.Background()
	url := testenv.AMQPURL(t)
	exchange, _, outQueue := topology(t, url)
	in := "batch-in-" + strings.TrimPrefix(exchange, "outbox-x-")
	declareQueues(t, url, in, in+".dlq")
	brokerenv.DeleteQueuesAtCleanup(t, url, append([]string{in, in + ".dlq"}, amqpsource.RetryQueueNames(in+".retry.")...)...)

	pool, schema, dbURL := relaytest.NewPool(t)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE applied (msg_key text NOT NULL, body text NOT NULL);
		CREATE TABLE dups (msg_key text NOT NULL, reason text NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// The messages, one in ten sent twice by the producer.
	var sends []amqp.Publishing
	for i := range n {
		p := amqp.Publishing{MessageId: fmt.Sprintf("m-%05d", i), Body: []byte(strconv.Itoa(i))}
		sends = append(sends, p)
		if rng.IntN(10) == 0 {
			sends = append(sends, p)
		}
	}
	publishConfirmed(t, url, in, sends)
	producerDups := len(sends) - n

	env := []string{
		batchWorkerEnv + "=1", batchDBEnv + "=" + dbURL, batchSchemaEnv + "=" + schema,
		batchQueueEnv + "=" + in, batchExchangeEnv + "=" + exchange,
	}
	start := func() *relaytest.Child { return relaytest.StartChild(t, "TestHelperBatchWorkerChild", env) }
	applied := func() int {
		var c int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Kill moments: when the business rows pass these counts, plus a random
	// delay of up to 30 ms.
	var killAt []int
	for k := range workerKills {
		killAt = append(killAt, int((float64(k)+0.3+0.4*rng.Float64())/float64(workerKills+1)*float64(n)))
	}
	w := start()
	killed := 0
	describe := func() string {
		return fmt.Sprintf("%d business rows of %d messages, outbox %s, %d kills, input queue %d, dead letters %d\nworker: %s",
			applied(), n, relaytest.Describe(t, pool), killed, queueDepth(t, url, in), queueDepth(t, url, in+".dlq"), tail(w.Output()))
	}
	timeout := relaytest.WaitTimeout
	if os.Getenv(batchLongEnv) == "1" {
		timeout *= 5
	}
	deadline := time.Now().Add(timeout)
	for done := false; !done; {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", describe())
		}
		select {
		case <-w.Done():
			t.Fatalf("worker exited on its own: %v\n%s", w.Err(), w.Output())
		case <-time.After(5 * time.Millisecond):
		}
		rows := applied()
		switch {
		case rows > n:
			t.Fatalf("%d business rows for %d messages: a message took effect twice\n%s", rows, n, describe())
		case len(killAt) > 0 && rows >= killAt[0]:
			killAt = killAt[1:]
			time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
			w.Kill()
			killed++
			t.Logf("SIGKILL worker (pid %d) at %d business rows", w.Pid(), rows)
			w = start()
		case len(killAt) == 0 && rows == n && queueDepth(t, url, in) == 0:
			// Stop the last worker gracefully: it acks what it committed.
			_ = syscall.Kill(w.Pid(), syscall.SIGTERM)
			select {
			case <-w.Done():
			case <-time.After(relaytest.WaitTimeout):
				t.Fatalf("worker did not stop on SIGTERM\n%s", w.Output())
			}
			if err := w.Err(); err != nil {
				t.Fatalf("worker stopped with %v\n%s", err, w.Output())
			}
			if queueDepth(t, url, in) == 0 {
				done = true
			} else {
				w = start() // it handed back what it had prefetched
			}
		}
		if d := queueDepth(t, url, in+".dlq"); d > 0 {
			t.Fatalf("%d dead letters\n%s", d, describe())
		}
	}

	// Each message: exactly one business row and one outbox row, with the
	// message's stable id.
	checkOncePerKey(t, pool, `SELECT msg_key FROM applied`, n, func(i int) string { return fmt.Sprintf("m-%05d", i) }, "business rows")
	wantID := func(i int) string { return fmt.Sprintf("%s:m-%05d/0", batchWorkerName, i) }
	checkOncePerKey(t, pool, `SELECT id FROM idemq_outbox`, n, wantID, "outbox rows")
	var dups int
	var reasons string
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(c), 0)::bigint, coalesce(string_agg(reason || ' ' || c, ', ' ORDER BY reason), '')
		FROM (SELECT reason, count(*) AS c FROM dups GROUP BY reason) r`).Scan(&dups, &reasons); err != nil {
		t.Fatal(err)
	}
	t.Logf("worker: %d SIGKILLs, %d deliveries sent (%d producer duplicates), %d duplicates absorbed (%s), %d business rows, %d outbox rows",
		killed, len(sends), producerDups, dups, reasons, n, n)
	if dups == 0 {
		// The count is a lower bound (a kill can lose a recorded
		// duplicate), but none at all means nothing was tested.
		t.Fatalf("no duplicate absorbed of %d deliveries for %d messages; the test proves nothing", len(sends), n)
	}

	// The relay, killed between confirm and update, then one that finishes.
	relayKilled := relaytest.RunKills(t, pool, dbURL, []string{testenv.EnvAMQPURL + "=" + url}, relayKills, 7)
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	relaytest.StartRelays(t, pool, pub, 1, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == int64(n)
	})
	total := queueDepth(t, url, outQueue)
	t.Logf("relay: %d SIGKILLs; %d event deliveries for %d events", relayKilled, total, n)

	// Downstream: every event applied once, by its stable id.
	src, err := amqpsource.New(ctx, amqpsource.Config{URL: url, Queue: outQueue, Logger: relaytest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	relaytest.Downstream(t, pool, schema, src, 4, total, n)
	checkOncePerKey(t, pool, `SELECT event_id FROM effects`, n, wantID, "downstream effects")
}

// declareQueues declares queues on the RabbitMQ broker at url.
func declareQueues(t testing.TB, url string, queues ...string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// publishConfirmed publishes msgs to queue through the default exchange
// and waits for the broker's confirm of each.
func publishConfirmed(t testing.TB, url, queue string, msgs []amqp.Publishing) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), relaytest.WaitTimeout)
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		m.DeliveryMode = amqp.Persistent
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, m)
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		ok, err := c.WaitContext(ctx)
		if err != nil || !ok {
			t.Fatalf("publish to %s not confirmed: %v", queue, err)
		}
	}
}

// checkOncePerKey fails unless query returns want(i) exactly once for each
// i < n, and nothing else.
func checkOncePerKey(t testing.TB, pool *pgxpool.Pool, query string, n int, want func(int) string, what string) {
	t.Helper()
	rows, err := pool.Query(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]int, len(got))
	for _, k := range got {
		seen[k]++
	}
	for i := range n {
		if c := seen[want(i)]; c != 1 {
			t.Fatalf("%s: %q found %d times, want once (%d rows for %d messages)", what, want(i), c, len(got), n)
		}
	}
	if len(got) != n {
		t.Fatalf("%s: %d rows for %d messages", what, len(got), n)
	}
}

// tail returns the last lines of a child's output.
func tail(s string) string {
	if i := len(s) - 2000; i > 0 {
		return "..." + s[i:]
	}
	return s
}
