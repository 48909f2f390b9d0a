package amqpoutbox_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
)

// topology declares a topic exchange bound to a queue with "#", and an
// exchange with no binding; both are deleted when the test ends.
func topology(t testing.TB, url string) (exchange, unbound, queue string) {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	suffix := hex.EncodeToString(b)
	exchange, unbound, queue = "outbox-x-"+suffix, "outbox-unbound-"+suffix, "outbox-q-"+suffix
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []string{exchange, unbound} {
		if err := ch.ExchangeDeclare(x, "topic", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	brokerenv.DeleteExchangesAtCleanup(t, url, exchange, unbound)
	brokerenv.DeleteQueuesAtCleanup(t, url, queue)
	return exchange, unbound, queue
}

// consumeAll reads n messages of queue in order and acks them.
func consumeAll(t testing.TB, url, queue string, n int) []relaytest.Got {
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
	ds, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []relaytest.Got
	timeout := time.After(relaytest.WaitTimeout)
	for len(got) < n {
		select {
		case d := <-ds:
			h, _ := d.Headers[outbox.HeaderIdempotencyKey].(string)
			if h != d.MessageId {
				t.Fatalf("message-id %q, idempotency-key header %q", d.MessageId, h)
			}
			got = append(got, relaytest.Got{ID: d.MessageId, Key: d.RoutingKey, Body: string(d.Body)})
		case <-timeout:
			t.Fatalf("consumed %d of %d", len(got), n)
		}
	}
	// Nothing more: a duplicate would show here.
	select {
	case d := <-ds:
		got = append(got, relaytest.Got{ID: d.MessageId, Key: d.RoutingKey, Body: string(d.Body)})
	case <-time.After(300 * time.Millisecond):
	}
	return got
}

// Two relays publish every row once, confirmed, with its stable id as the
// message-id, in order per key; rows for a missing exchange and for an
// exchange that routes nowhere are parked after MaxAttempts.
func TestRelayAMQP(t *testing.T) {
	url := testenv.AMQPURL(t)
	exchange, unbound, queue := topology(t, url)
	pool, _, _ := relaytest.NewPool(t)
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	want := relaytest.Messages("a", exchange, 300, 5)
	relaytest.Insert(t, pool, want[:150])
	relaytest.Insert(t, pool, []outbox.Message{
		{ID: "poison-missing", Destination: "no-such-exchange-" + exchange, Key: "k-p1", Body: []byte("x")},
		{ID: "poison-unroutable", Destination: unbound, Key: "k-p2", Body: []byte("y")},
	})
	relaytest.StartRelays(t, pool, pub, 2, relaytest.FastConfig())
	relaytest.Insert(t, pool, want[150:])
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		c := relaytest.Counts(t, pool)
		return c.Pending == 0 && c.Parked == 2
	})
	if c := relaytest.Counts(t, pool); c.Sent != int64(len(want)) {
		t.Fatalf("%s, want %d sent", relaytest.Describe(t, pool), len(want))
	}
	relaytest.Check(t, want, consumeAll(t, url, queue, len(want)), false)
}

// One relay with Concurrency 2 (two claim loops, each recording a batch
// while it publishes the next, on channels of their own) publishes every
// row once, in order per key; a row the broker returns stays pending with
// its attempts counted, and the later row of its key waits behind it.
func TestRelayAMQPConcurrency2(t *testing.T) {
	url := testenv.AMQPURL(t)
	exchange, unbound, queue := topology(t, url)
	pool, _, _ := relaytest.NewPool(t)
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	want := relaytest.Messages("c", exchange, 400, 5)
	relaytest.Insert(t, pool, []outbox.Message{
		{ID: "returned", Destination: unbound, Key: "k-r", Body: []byte("x")},
		{ID: "after-returned", Destination: exchange, Key: "k-r", Body: []byte("y")},
	})
	relaytest.Insert(t, pool, want)
	cfg := relaytest.FastConfig()
	cfg.BatchSize, cfg.Concurrency, cfg.MaxAttempts = 20, 2, 1000
	relaytest.StartRelays(t, pool, pub, 1, cfg)
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == int64(len(want))
	})
	relaytest.Check(t, want, consumeAll(t, url, queue, len(want)), false)
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		var attempts int
		_ = pool.QueryRow(t.Context(), `SELECT attempts FROM idemq_outbox WHERE id = 'returned'`).Scan(&attempts)
		return attempts >= 2
	})
	rows, err := pool.Query(t.Context(), `SELECT id, state, attempts, coalesce(last_error, '') FROM idemq_outbox WHERE partition_key = 'k-r' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, lastErr string
		var state, attempts int
		if err := rows.Scan(&id, &state, &attempts, &lastErr); err != nil {
			t.Fatal(err)
		}
		switch {
		case state != 0:
			t.Fatalf("row %s: state %d, want pending", id, state)
		case id == "returned" && !strings.Contains(lastErr, "returned by the broker"):
			t.Fatalf("returned row: last error %q", lastErr)
		case id == "after-returned" && attempts != 0:
			t.Fatalf("the row after the returned one was tried %d times; it must wait", attempts)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// A relay whose broker cannot be dialled reports an outage
// (outbox.ErrUnavailable, a plain error for the whole batch): every row
// stays pending with no attempt counted, none is marked sent, and a relay
// with the broker back publishes them all.
func TestRelayAMQPOutage(t *testing.T) {
	url := testenv.AMQPURL(t)
	exchange, _, queue := topology(t, url)
	pool, _, _ := relaytest.NewPool(t)
	want := relaytest.Messages("o", exchange, 20, 3)
	relaytest.Insert(t, pool, want)

	// A publisher pointed at a closed port stands in for a broker that is down.
	down, err := amqpoutbox.New(amqpoutbox.Config{URL: "amqp://guest:guest@127.0.0.1:1/", ConfirmTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	r, err := outbox.NewRelay(pool, down, relaytest.FastConfig())
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		_, err := r.RelayOnce(t.Context())
		if c := relaytest.Counts(t, pool); c.Sent != 0 || c.Pending != int64(len(want)) {
			t.Fatalf("relay with the broker down (%v): %s; want all %d pending, none sent", err, relaytest.Describe(t, pool), len(want))
		}
		if !errors.Is(err, outbox.ErrUnavailable) {
			t.Fatalf("relay with the broker down: %v, want ErrUnavailable", err)
		}
	}
	var attempts int
	if err := pool.QueryRow(t.Context(), `SELECT coalesce(max(attempts), 0) FROM idemq_outbox`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Fatalf("after an outage: max attempts %d, want 0", attempts)
	}
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	relaytest.StartRelays(t, pool, pub, 1, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == int64(len(want))
	})
	relaytest.Check(t, want, consumeAll(t, url, queue, len(want)), false)
}
