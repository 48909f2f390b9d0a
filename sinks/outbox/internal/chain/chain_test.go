package chain_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
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
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sinks/webhook"
	"github.com/idemq/idemq/sinks/webhook/webhooktest"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/kafkasource"
)

// Environment of the consumer child processes.
const (
	roleEnv     = "IDEMQ_CHAIN_ROLE" // "a" or "b" in a consumer child
	dbEnv       = "IDEMQ_CHAIN_DB"
	schemaEnv   = "IDEMQ_CHAIN_SCHEMA"
	topicEnv    = "IDEMQ_CHAIN_TOPIC"
	exchangeEnv = "IDEMQ_CHAIN_EXCHANGE"
	queueEnv    = "IDEMQ_CHAIN_QUEUE"
	prefixEnv   = "IDEMQ_CHAIN_REDIS_PREFIX"
	webhookEnv  = "IDEMQ_CHAIN_WEBHOOK"

	// longEnv set to 1 runs the long mode: more orders and more kills.
	longEnv = "IDEMQ_CHAIN_LONG"
)

// accounts is the number of partition keys of the charges and events.
const accounts = 8

// notifyPrefix starts the Idempotency-Key of every notification: B's
// consumer.IdempotencyKey is scoped by its runner's name, and the event's
// stable id (A's key, "/", the publish's index) by A's.
const notifyPrefix = "chain-b:chain-a:"

// lease is consumer B's lease: a killed B holds its keys this long.
const lease = 2 * time.Second

// order is the body of an order (topic) and of its event (queue).
type order struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

// TestHelperRelayChild is the relay process of TestChain. It does nothing
// when run on its own.
func TestHelperRelayChild(t *testing.T) {
	relaytest.ChildMain(t, func(t *testing.T) outbox.Publisher {
		pub, err := amqpoutbox.New(amqpoutbox.Config{URL: testenv.AMQPURL(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		return pub
	})
}

// TestHelperConsumerChild is consumer A or B of TestChain. It does nothing
// when run on its own.
func TestHelperConsumerChild(t *testing.T) {
	role := os.Getenv(roleEnv)
	if role == "" {
		t.Skip("helper process of TestChain")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // never outlive the parent by much
	defer cancel()
	var r *consumer.Runner
	switch role {
	case "a":
		r = consumerA(ctx, t)
	case "b":
		r = consumerB(ctx, t)
	default:
		t.Fatalf("unknown role %q", role)
	}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// consumerA charges each order and publishes its event in the same
// transaction.
func consumerA(ctx context.Context, t *testing.T) *consumer.Runner {
	pcfg, err := pgxpool.ParseConfig(os.Getenv(dbEnv))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 6 // one per lane, and one for the janitor
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: os.Getenv(schemaEnv)})
	if err != nil {
		t.Fatal(err)
	}
	topic := os.Getenv(topicEnv)
	src, err := kafkasource.New(ctx, kafkasource.Config{
		Brokers: testenv.KafkaBrokers(t), Topics: []string{topic}, GroupID: topic + "-a",
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 300 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
		JoinGroupBackoff: 200 * time.Millisecond, MaxWait: 250 * time.Millisecond, CommitInterval: 100 * time.Millisecond,
		Logger: relaytest.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	exchange := os.Getenv(exchangeEnv)
	charge := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var o order
		if err := json.Unmarshal(m.Body, &o); err != nil {
			return consumer.Permanent(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ($1, $2)`, o.ID, o.Amount); err != nil {
			return err
		}
		_, err := outbox.Publish(ctx, tx, outbox.Message{Destination: exchange, Key: o.Account, Body: m.Body})
		return err
	}
	r, err := consumer.NewRunner(src, consumer.Transactional(store, charge), consumer.Config{
		Name: "chain-a", BatchSize: 10, Concurrency: 4, Logger: relaytest.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// consumerB sends each event to the webhook on the lease path.
func consumerB(ctx context.Context, t *testing.T) *consumer.Runner {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	store, err := redisdedup.New(rdb, redisdedup.Config{Prefix: os.Getenv(prefixEnv)})
	if err != nil {
		t.Fatal(err)
	}
	src, err := amqpsource.New(ctx, amqpsource.Config{URL: testenv.AMQPURL(t), Queue: os.Getenv(queueEnv), Prefetch: 16, Logger: relaytest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	sink, err := webhook.New(webhook.Config{URL: os.Getenv(webhookEnv), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r, err := consumer.NewRunner(src, consumer.Leased(store, sink.Handler(), consumer.LeaseOptions{Lease: lease, InProgressDelay: lease / 2}),
		consumer.Config{Name: "chain-b", BatchSize: 4, Concurrency: 4, Logger: relaytest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// chainSize is the number of orders and the kills of each process.
func chainSize() (orders, killsA, killsRelay, killsB int) {
	if os.Getenv(longEnv) == "1" {
		return 2000, 6, 20, 10
	}
	return 240, 2, 6, 3
}

// TestChain is the outbox's end-to-end proof: a producer sends orders (some
// twice) to Kafka; consumer A charges each order in PostgreSQL and
// publishes its event with outbox.Publish in the same transaction; relays
// publish the events to RabbitMQ; consumer B sends each event to a webhook
// on the Redis lease path. A, the relay and B run as child processes and
// each is SIGKILLed several times: A at random moments, the relay right
// after RabbitMQ confirmed a batch and before the rows are marked sent, B
// at random moments. Each order must be charged exactly once, and
// notified once per Idempotency-Key (the webhook receiver counts by key, as
// a receiver that deduplicates does), none missing.
//
// IDEMQ_CHAIN_LONG=1 (make test-chain-long) runs ten times the orders and
// more kills.
func TestChain(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; skipped with -short")
	}
	n, killsA, killsRelay, killsB := chainSize()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 15))
	t.Logf("%d orders; kills: A %d, relay %d, B %d; seed %d", n, killsA, killsRelay, killsB, seed)
	ctx := context.Background()

	pool, schema, dbURL := relaytest.NewPool(t)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id text NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	suffix := randomSuffix()
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, "idemq-chain-orders-"+suffix)
	amqpURL := testenv.AMQPURL(t)
	exchange, queue := newQueue(t, amqpURL, "idemq-chain-"+suffix)
	recv := webhooktest.New(t, nil)

	env := []string{
		dbEnv + "=" + dbURL, schemaEnv + "=" + schema, topicEnv + "=" + topic,
		exchangeEnv + "=" + exchange, queueEnv + "=" + queue,
		prefixEnv + "=idemq-chain-" + suffix + ":", webhookEnv + "=" + recv.URL(),
	}
	start := func(role string) *relaytest.Child {
		return relaytest.StartChild(t, "TestHelperConsumerChild", append(env[:len(env):len(env)], roleEnv+"="+role))
	}
	const relayBatch = 5
	relayLife := 0
	startRelay := func(killAfter int) *relaytest.Child {
		relayLife++
		return relaytest.StartChild(t, relaytest.ChildTestName, relaytest.RelayEnv(dbURL, killAfter, relayBatch))
	}

	// The orders, spread over about eight seconds, some sent twice.
	want := make(map[string]order, n)
	var msgs []kafka.Message
	for i := range n {
		o := order{ID: fmt.Sprintf("order-%s-%04d", suffix, i), Account: "acct-" + strconv.Itoa(i%accounts), Amount: 1 + rng.IntN(500)}
		want[o.ID] = o
		body, _ := json.Marshal(o)
		m := kafka.Message{Key: []byte(o.Account), Value: body, Headers: []kafka.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte(o.ID)}}}
		msgs = append(msgs, m)
		if rng.IntN(10) == 0 {
			msgs = append(msgs, m) // the producer's re-send
		}
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: 10 * time.Millisecond}
	defer w.Close()
	produced := make(chan error, 1)
	go func() {
		const chunks = 40
		size := (len(msgs) + chunks - 1) / chunks
		for rest := msgs; len(rest) > 0; {
			k := min(size, len(rest))
			if err := w.WriteMessages(ctx, rest[:k]...); err != nil {
				produced <- err
				return
			}
			rest = rest[k:]
			time.Sleep(200 * time.Millisecond)
		}
		produced <- nil
	}()

	// Kill moments of A and B: when the charges (A) or the notified keys
	// (B) pass these counts.
	killAt := func(kills int) []int {
		var at []int
		for k := range kills {
			at = append(at, int((float64(k)+0.3+0.4*rng.Float64())/float64(kills+1)*float64(n)))
		}
		return at
	}
	killAtA, killAtB := killAt(killsA), killAt(killsB)
	a, b, relay := start("a"), start("b"), startRelay(1)
	var killedA, killedB, killedRelay int
	producing := true
	describe := func() string {
		c, keys := charges(t, pool)
		return fmt.Sprintf("charges %d (%d orders), notified keys %d, outbox %s; kills A %d, relay %d, B %d\nA: %s\nB: %s\nrelay: %s",
			c, keys, len(recv.Keys()), relaytest.Describe(t, pool), killedA, killedRelay, killedB,
			tail(a.Output()), tail(b.Output()), tail(relay.Output()))
	}
	deadline := time.Now().Add(2 * relaytest.WaitTimeout)
	if os.Getenv(longEnv) == "1" {
		deadline = time.Now().Add(10 * relaytest.WaitTimeout)
	}
	for {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", describe())
		}
		time.Sleep(100 * time.Millisecond)
		if producing {
			select {
			case err := <-produced:
				if err != nil {
					t.Fatalf("produce: %v", err)
				}
				producing = false
			default:
			}
		}
		for role, c := range map[string]*relaytest.Child{"A": a, "B": b} {
			select {
			case <-c.Done():
				t.Fatalf("consumer %s exited on its own: %v\n%s", role, c.Err(), c.Output())
			default:
			}
		}
		select {
		case <-relay.Done():
			if !relay.Killed() {
				t.Fatalf("relay exited on its own: %v\n%s", relay.Err(), relay.Output())
			}
			killedRelay++
			next := 1 + relayLife%3 // after the 1st, 2nd or 3rd confirmed batch
			if killedRelay >= killsRelay {
				next = 0 // the last relay is not killed
			}
			relay = startRelay(next)
		default:
		}
		chargedRows, _ := charges(t, pool)
		notified := len(recv.Keys())
		if len(killAtA) > 0 && chargedRows >= killAtA[0] {
			killAtA = killAtA[1:]
			a.Kill()
			killedA++
			t.Logf("SIGKILL A (pid %d) at %d charges", a.Pid(), chargedRows)
			a = start("a")
		}
		if len(killAtB) > 0 && notified >= killAtB[0] {
			killAtB = killAtB[1:]
			time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond) // not always at a tick
			b.Kill()
			killedB++
			t.Logf("SIGKILL B (pid %d) at %d notified keys", b.Pid(), notified)
			b = start("b")
		}
		if !producing && len(killAtA) == 0 && len(killAtB) == 0 && chargedRows >= n && notified >= n &&
			relaytest.Counts(t, pool).Pending == 0 {
			break
		}
	}
	if killedRelay < killsRelay {
		t.Fatalf("only %d relay kills before every event was sent; the test proves too little", killedRelay)
	}
	// Let the consumers settle what is in flight, then stop them.
	time.Sleep(500 * time.Millisecond)
	a.Kill()
	b.Kill()
	relay.Kill()

	// Hop 1: each order charged exactly once, none missing.
	rows, err := pool.Query(ctx, `SELECT order_id, amount FROM charges`)
	if err != nil {
		t.Fatal(err)
	}
	charged := map[string]int{}
	for rows.Next() {
		var id string
		var amount int
		if err := rows.Scan(&id, &amount); err != nil {
			t.Fatal(err)
		}
		o, ok := want[id]
		if !ok || o.Amount != amount {
			t.Fatalf("charge of %s for %d: no such order", id, amount)
		}
		charged[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range want {
		if charged[id] != 1 {
			t.Errorf("order %s charged %d times, want 1", id, charged[id])
		}
	}
	// Hop 2: one notification per key, carrying its order; none missing.
	posts := 0
	for _, key := range recv.Keys() {
		id, ok := strings.CutSuffix(strings.TrimPrefix(key, notifyPrefix), "/0")
		o, known := want[id]
		if !ok || !known {
			t.Fatalf("notification with Idempotency-Key %q: no such event", key)
		}
		for _, body := range recv.Bodies(key) {
			var got order
			if err := json.Unmarshal(body, &got); err != nil || got != o {
				t.Fatalf("notification %s carries %s, want %+v", key, body, o)
			}
		}
		posts += recv.Calls(key)
	}
	for id := range want {
		if recv.Successes(notifyPrefix+id+"/0") == 0 {
			t.Errorf("order %s never notified", id)
		}
	}
	if m := recv.MaxConcurrent(); m > 1 {
		t.Errorf("%d webhook calls of one key in flight at once; the lease must serialise them", m)
	}
	if t.Failed() {
		t.Fatalf("%s", describe())
	}
	t.Logf("%d orders (%d messages with the producer's re-sends): %d charged once each; %d keys notified, in %d webhook calls (%d repeated by B's lease window); outbox %s; kills: A %d, relay %d (between confirm and update), B %d",
		n, len(msgs), len(charged), len(recv.Keys()), posts, posts-len(recv.Keys()), relaytest.Describe(t, pool), killedA, killedRelay, killedB)
}

// charges returns the number of charge rows and of distinct orders charged.
func charges(t testing.TB, pool *pgxpool.Pool) (rows, orders int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT order_id) FROM charges`).Scan(&rows, &orders); err != nil {
		t.Fatal(err)
	}
	return rows, orders
}

// tail returns the last lines of a child's output.
func tail(s string) string {
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

// newTopic creates topic with four partitions.
func newTopic(t testing.TB, brokers []string, topic string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic, Partitions: 4}); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic)
	return topic
}

// newQueue declares a topic exchange and a queue bound to it with "#"; the
// test's cleanup deletes them with the queue's retry queues.
func newQueue(t testing.TB, url, name string) (exchange, queue string) {
	t.Helper()
	exchange, queue = name+"-x", name+"-q"
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	brokerenv.DeleteExchangesAtCleanup(t, url, exchange)
	// B's source declares its retry queues on first use.
	brokerenv.DeleteQueuesAtCleanup(t, url, amqpsource.QueueNames(amqpsource.Config{Queue: queue})...)
	return exchange, queue
}
