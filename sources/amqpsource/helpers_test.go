package amqpsource_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// testTimeout bounds every wait of a test in this package.
const testTimeout = 60 * time.Second

// backTimeout bounds the wait for a message the test expects back within
// a fraction of a second (a retry copy after a short delay, a parked copy
// after a short UnroutableDelay, a delivery requeued by a Close): ample on a
// loaded machine, and a message that never comes back (a settle that pins
// the delivery) fails the test in seconds rather than after testTimeout.
const backTimeout = 10 * time.Second

// brokerURL returns the test broker's URL; tests needing it skip with -short
// and fail when the broker is missing.
func brokerURL(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs RabbitMQ; skipped with -short")
	}
	return testenv.AMQPURL(t)
}

// withChannel runs fn on a fresh channel of a fresh connection.
func withChannel(t testing.TB, url string, fn func(ch *amqp.Channel) error) error {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return fn(ch)
}

// queueName returns a queue name unique to this test run.
func queueName(t testing.TB) string {
	var b strings.Builder
	b.WriteString("idemq.test.")
	for _, r := range strings.ToLower(t.Name()) {
		if b.Len() >= 70 {
			break
		}
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return b.String() + "." + hex.EncodeToString(rnd[:])
}

// queueKind selects how newQueue declares a queue.
type queueKind int

const (
	classic queueKind = iota
	quorum
)

// newQueue declares a fresh queue with a dead-letter queue, as
// amqpsource's Config.Declare would, and deletes them (and the retry
// queues) when t ends.
func newQueue(t testing.TB, url string, kind queueKind, deliveryLimit int) string {
	t.Helper()
	name := queueName(t)
	topo := &amqpsource.Topology{QueueType: amqpsource.QueueTypeClassic}
	if kind == quorum {
		topo = &amqpsource.Topology{QueueType: amqpsource.QueueTypeQuorum, DeliveryLimit: deliveryLimit}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	src, err := amqpsource.New(ctx, amqpsource.Config{URL: url, Queue: name, Declare: topo})
	if err != nil {
		t.Fatalf("declare queue %s: %v", name, err)
	}
	_ = src.Close()
	deleteQueuesAtCleanup(t, url, name)
	return name
}

// deleteQueuesAtCleanup deletes queue, its dead-letter queue and its retry
// queues when t ends.
func deleteQueuesAtCleanup(t testing.TB, url, queue string) {
	t.Helper()
	brokerenv.DeleteQueuesAtCleanup(t, url, amqpsource.QueueNames(amqpsource.Config{Queue: queue})...)
}

// publish publishes msgs to queue through the default exchange, persistent
// and confirmed: Key goes into the idempotency-key header, "id-"+Key into the
// message-id property. An empty Key publishes a message with neither.
func publish(t testing.TB, url, queue string, msgs ...sourcetest.Outgoing) {
	t.Helper()
	err := withChannel(t, url, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		var pending []*amqp.DeferredConfirmation
		for _, m := range msgs {
			h := amqp.Table{}
			for k, v := range m.Headers {
				h[k] = v
			}
			p := amqp.Publishing{Headers: h, DeliveryMode: amqp.Persistent, Body: m.Body}
			if m.Key != "" {
				h[amqpsource.DefaultKeyHeader] = m.Key
				p.MessageId = "id-" + m.Key
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, p)
			if err != nil {
				return err
			}
			pending = append(pending, dc)
		}
		for _, dc := range pending {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				return fmt.Errorf("publish not confirmed (acked %v): %w", ok, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("publish %d message(s) to %s: %v", len(msgs), queue, err)
	}
}

// outgoing returns n messages keyed prefix-0000, ...
func outgoing(prefix string, n int) []sourcetest.Outgoing {
	out := make([]sourcetest.Outgoing, n)
	for i := range out {
		k := fmt.Sprintf("%s-%04d", prefix, i)
		out[i] = sourcetest.Outgoing{Key: k, Body: fmt.Appendf(nil, `{"key":%q}`, k)}
	}
	return out
}

// peek returns the messages in queue without removing them: it gets them
// unacknowledged on one channel and closes it, which requeues them.
func peek(t testing.TB, url, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	err := withChannel(t, url, func(ch *amqp.Channel) error {
		for range 10000 {
			d, ok, err := ch.Get(queue, false)
			if err != nil || !ok {
				return err
			}
			out = append(out, d)
		}
		return errors.New("more than 10000 messages")
	})
	if err != nil {
		t.Fatalf("peek %s: %v", queue, err)
	}
	return out
}

// queueDepth returns the number of ready messages in queue.
func queueDepth(t testing.TB, url, queue string) int {
	t.Helper()
	var n int
	err := withChannel(t, url, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	if err != nil {
		t.Fatalf("inspect %s: %v", queue, err)
	}
	return n
}

// newSource opens a source on queue, closed when t ends.
func newSource(t testing.TB, cfg amqpsource.Config) *amqpsource.Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	src, err := amqpsource.New(ctx, cfg)
	if err != nil {
		t.Fatalf("amqpsource.New: %v", err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// receive receives until n messages arrived or the timeout passes.
func receive(t testing.TB, src consumer.Source, n int, timeout time.Duration) []*consumer.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*consumer.Message
	for len(out) < n {
		msgs, err := src.Receive(ctx, n-len(out))
		if err != nil {
			t.Fatalf("received %d of %d messages: %v", len(out), n, err)
		}
		out = append(out, msgs...)
	}
	return out
}

// forceCloseConnections closes, broker-side, every connection whose client
// name is amqpsource's default for queue, as a network failure would. It
// returns the number closed.
func forceCloseConnections(t testing.TB, queue string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "list_connections", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v\n%s", err, out)
	}
	marker := []byte(fmt.Sprintf("%q", "idemq amqpsource "+queue))
	n := 0
	for line := range bytes.SplitSeq(out, []byte("\n")) {
		if !bytes.Contains(line, marker) {
			continue
		}
		pid, _, _ := bytes.Cut(line, []byte("\t"))
		if o, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "close_connection", string(pid), "idemq test: forced close").CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl close_connection %s: %v\n%s", pid, err, o)
		}
		n++
	}
	return n
}

// database is a PostgreSQL schema with a dedup store and an effects table
// that counts how often each key's effect was applied.
type database struct {
	pool   *pgxpool.Pool
	store  *pgdedup.Store
	schema string
	url    string // with search_path set to schema
}

func newDatabase(t testing.TB) *database {
	t.Helper()
	base := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, base)
	url, err := testenv.WithSearchPath(base, schema)
	if err != nil {
		t.Fatal(err)
	}
	db := openDatabase(t, url, schema)
	if err := db.store.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := db.pool.Exec(context.Background(), `CREATE TABLE effects (key text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatalf("create effects: %v", err)
	}
	return db
}

func openDatabase(t testing.TB, url, schema string) *database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to PostgreSQL: %v", err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return &database{pool: pool, store: store, schema: schema, url: url}
}

// apply is the effect of the tests' handlers: it counts applications per key.
func apply(ctx context.Context, tx pgx.Tx, key string) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (key, n) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = effects.n + 1`, key)
	return err
}

// effects returns the number of applications per key.
func (db *database) effects(t testing.TB) map[string]int {
	t.Helper()
	rows, err := db.pool.Query(context.Background(), `SELECT key, n FROM effects`)
	if err != nil {
		t.Fatalf("read effects: %v", err)
	}
	m := map[string]int{}
	var k string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error { m[k] = n; return nil })
	if err != nil {
		t.Fatalf("read effects: %v", err)
	}
	return m
}

// requireExactlyOnce fails t unless every key in keys was applied exactly
// once and nothing else was applied.
func (db *database) requireExactlyOnce(t testing.TB, keys []string) {
	t.Helper()
	got := db.effects(t)
	for _, k := range keys {
		if got[k] != 1 {
			t.Errorf("key %s applied %d times, want exactly once", k, got[k])
		}
	}
	if len(got) != len(keys) {
		t.Errorf("%d keys applied, want %d", len(got), len(keys))
	}
}

func keysOf(msgs []sourcetest.Outgoing) []string {
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		keys[i] = m.Key
	}
	return keys
}
