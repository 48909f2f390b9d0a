package amqpsource_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/sourcetest"
)

func sortedKeys(msgs []*consumer.Message) []string {
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		keys[i] = m.Key
	}
	slices.Sort(keys)
	return keys
}

// A multiple-ack must never cover a delivery that was not passed to Ack:
// acknowledging a prefix, then isolated messages, leaves exactly the others
// for the next consumer.
func TestAckNeverCoversOtherDeliveries(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	out := outgoing("ack", 10)
	publish(t, url, q, out...)

	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 20})
	msgs := receive(t, src, 10, testTimeout)
	slices.SortFunc(msgs, func(a, b *consumer.Message) int { return strings.Compare(a.Key, b.Key) })
	ctx := context.Background()
	// Out of order within the call: 3, 0, 4, 1, 2 is still the prefix 0..4.
	if err := src.Ack(ctx, []*consumer.Message{msgs[3], msgs[0], msgs[4], msgs[1], msgs[2], msgs[7]}); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if err := src.Ack(ctx, msgs[9:10]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	// Settling twice sends nothing (it would close the channel) and says so.
	if err := src.Ack(ctx, msgs[9:10]); err == nil {
		t.Errorf("second Ack of the same message returned nil")
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	next := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 20})
	back := receive(t, next, 3, testTimeout)
	want := []string{out[5].Key, out[6].Key, out[8].Key}
	if got := sortedKeys(back); !slices.Equal(got, want) {
		t.Fatalf("redelivered %v, want %v", got, want)
	}
	for _, m := range back {
		if !m.Redelivered {
			t.Errorf("message %s: Redelivered is false after a requeue", m.Key)
		}
	}
	runtest.ExpectNothing(t, next, 500*time.Millisecond)
}

// When the connection dies, acknowledgements of the dead channel's
// deliveries are not sent: the numbers are reused on the new channel, where
// they would acknowledge unprocessed deliveries.
func TestStaleAcksAreNotSent(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	out := outgoing("stale", 5)
	publish(t, url, q, out...)

	src := newSource(t, amqpsource.Config{URL: url, Queue: q, ReconnectDelay: 20 * time.Millisecond})
	old := receive(t, src, 5, testTimeout)
	if n := forceCloseConnections(t, q); n != 1 {
		t.Fatalf("closed %d connections, want 1", n)
	}
	// The same deliveries come back on the new channel, with the same tags.
	fresh := receive(t, src, 5, testTimeout)
	for _, m := range fresh {
		if !m.Redelivered {
			t.Errorf("message %s: Redelivered is false after the connection dropped", m.Key)
		}
	}
	if got := src.Stats().Reconnects; got != 1 {
		t.Errorf("Stats().Reconnects = %d, want 1", got)
	}
	err := src.Ack(context.Background(), old)
	if !errors.Is(err, amqpsource.ErrStaleDelivery) {
		t.Fatalf("Ack of the dead channel's deliveries = %v, want ErrStaleDelivery", err)
	}
	for _, m := range old[:2] {
		if err := src.Retry(context.Background(), m, 0); !errors.Is(err, amqpsource.ErrStaleDelivery) {
			t.Errorf("Retry of a dead channel's delivery = %v, want ErrStaleDelivery", err)
		}
	}
	if err := src.DeadLetter(context.Background(), old[2], errors.New("x")); !errors.Is(err, amqpsource.ErrStaleDelivery) {
		t.Errorf("DeadLetter of a dead channel's delivery = %v, want ErrStaleDelivery", err)
	}
	if got := src.Stats().StaleSettles; got != 8 {
		t.Errorf("Stats().StaleSettles = %d, want 8", got)
	}
	_ = src.Close()

	// Had the stale acks, retries or dead letters gone out, some of the
	// fresh deliveries would be gone.
	next := newSource(t, amqpsource.Config{URL: url, Queue: q})
	back := receive(t, next, 5, testTimeout)
	if got, want := sortedKeys(back), keysOf(out); !slices.Equal(got, want) {
		t.Fatalf("after the stale settlements the queue holds %v, want %v", got, want)
	}
	if err := next.Ack(context.Background(), back); err != nil {
		t.Fatal(err)
	}
	if n := len(peek(t, url, q+".dlq")); n != 0 {
		t.Errorf("dead-letter queue holds %d messages, want 0", n)
	}
}

// Deliveries buffered in the client and never returned by Receive go back to
// the queue on Close.
func TestCloseReturnsBufferedDeliveries(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	out := outgoing("buffered", 30)
	publish(t, url, q, out...)

	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 50})
	first := receive(t, src, 1, testTimeout)
	// Let the rest arrive in the client's buffer.
	runtest.WaitFor(t, testTimeout, runtest.Say("the broker to hand out every message"), func() bool { return queueDepth(t, url, q) == 0 })
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	next := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 50})
	back := receive(t, next, 30, testTimeout)
	if got := sortedKeys(back); !slices.Equal(got, keysOf(out)) {
		t.Fatalf("after Close the queue holds %d messages (%v...), want all 30", len(got), got[:min(3, len(got))])
	}
	if !slices.Contains(sortedKeys(back), first[0].Key) {
		t.Errorf("the received but unacknowledged message %s did not come back", first[0].Key)
	}
}

// The key is the configured header, else the message-id; a message with
// neither has no key unless BodyHashKey is on, and Source.Key gives the
// typed error.
func TestKeys(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	publish(t, url, q,
		sourcetest.Outgoing{Key: "k1", Body: []byte("a"), Headers: map[string]string{"account": "7"}}, // header k1, message-id id-k1
		sourcetest.Outgoing{Body: []byte("same")},                                                     // neither
		sourcetest.Outgoing{Body: []byte("same")},
	)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 10, PartitionKeyHeader: "account"})
	msgs := receive(t, src, 3, testTimeout)
	slices.SortFunc(msgs, func(a, b *consumer.Message) int { return strings.Compare(string(a.Body), string(b.Body)) })
	if m := msgs[0]; m.Key != "k1" || m.ID != "id-k1" || m.Attempt != 1 || m.Topic != q || m.PartitionKey != "7" {
		t.Errorf("keyed message: Key %q ID %q Attempt %d Topic %q PartitionKey %q", m.Key, m.ID, m.Attempt, m.Topic, m.PartitionKey)
	}
	if m := msgs[1]; m.Key != "" || m.ID != "" {
		t.Errorf("keyless message: Key %q ID %q, want both empty", m.Key, m.ID)
	}
	if _, err := consumer.RequireKey(msgs[1]); !errors.Is(err, consumer.ErrMissingKey) {
		t.Errorf("RequireKey of a keyless message = %v, want ErrMissingKey", err)
	}
	_ = src.Close()

	hashed := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 10, BodyHashKey: true, KeyHeader: "no-such-header"})
	msgs = receive(t, hashed, 3, testTimeout)
	byBody := map[string][]string{}
	for _, m := range msgs {
		byBody[string(m.Body)] = append(byBody[string(m.Body)], m.Key)
	}
	if k := byBody["a"]; len(k) != 1 || k[0] != "id-k1" {
		t.Errorf("without the key header the key is %v, want the message-id", k)
	}
	if k := byBody["same"]; len(k) != 2 || k[0] != k[1] || !strings.HasPrefix(k[0], "sha256:") {
		t.Errorf("body-hash keys of identical bodies = %v, want two equal sha256: keys", k)
	}
}

// A dead-letter destination that does not exist must neither drop the
// message nor spin it: it is parked in a retry queue and comes back.
func TestUnroutableDeadLetterIsParked(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	publish(t, url, q, outgoing("parked", 1)...)
	src := newSource(t, amqpsource.Config{
		URL: url, Queue: q,
		DeadLetterRoutingKey: q + ".missing",
		UnroutableDelay:      200 * time.Millisecond,
	})
	m := receive(t, src, 1, testTimeout)[0]
	err := src.DeadLetter(context.Background(), m, errors.New("poison"))
	if !errors.Is(err, amqpsource.ErrUnroutable) {
		t.Fatalf("DeadLetter to a missing queue = %v, want ErrUnroutable", err)
	}
	back := receive(t, src, 1, backTimeout)[0]
	if back.Key != m.Key || back.Attempt != m.Attempt+1 || !back.Redelivered {
		t.Errorf("parked message came back as key %q attempt %d redelivered %v, want %q attempt %d redelivered",
			back.Key, back.Attempt, back.Redelivered, m.Key, m.Attempt+1)
	}
	if got := src.Stats().Unroutable; got != 1 {
		t.Errorf("Stats().Unroutable = %d, want 1", got)
	}
	if err := src.Ack(context.Background(), []*consumer.Message{back}); err != nil {
		t.Fatal(err)
	}
}

// A quorum queue's delivery limit is respected: a message that keeps coming
// back unsettled (its consumer dies each time) is dead-lettered by the
// broker, and Attempt counts those deliveries.
func TestQuorumDeliveryLimit(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	const limit = 2
	q := newQueue(t, url, quorum, limit)
	publish(t, url, q, outgoing("limit", 1)...)

	var attempts []int
	for len(peek(t, url, q+".dlq")) == 0 {
		if len(attempts) > limit+1 {
			t.Fatalf("delivered %d times (attempts %v) with x-delivery-limit %d and not dead-lettered", len(attempts), attempts, limit)
		}
		src := newSource(t, amqpsource.Config{URL: url, Queue: q})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		msgs, err := src.Receive(ctx, 1)
		cancel()
		if err == nil {
			attempts = append(attempts, msgs[0].Attempt)
		}
		_ = src.Close() // a crash: the delivery goes back unsettled
	}
	for i, a := range attempts {
		if a != i+1 {
			t.Fatalf("attempts of the redeliveries = %v, want 1, 2, ...", attempts)
		}
	}
	if len(attempts) == 0 {
		t.Fatal("message was dead-lettered without being delivered")
	}
	dl := peek(t, url, q+".dlq")
	if len(dl) != 1 || dl[0].Headers["x-first-death-reason"] == nil {
		t.Fatalf("dead-letter queue holds %d messages (headers %v), want the message with its x-death", len(dl), dl[0].Headers)
	}
	t.Logf("delivered %d times, then dead-lettered by the broker: %v", len(attempts), dl[0].Headers["x-first-death-reason"])
}

// BenchmarkReceiveAck measures the source alone: receive and acknowledge
// pre-published persistent messages, no handler. The comparison with a raw
// consumer and the Runner is `go -C cmd/internal run ./bench/amqp`.
func BenchmarkReceiveAck(b *testing.B) {
	url := brokerURL(b)
	q := newQueue(b, url, classic, 0)
	out := outgoing("bench", b.N)
	for i := 0; i < len(out); i += 5000 {
		publish(b, url, q, out[i:min(i+5000, len(out))]...)
	}
	src := newSource(b, amqpsource.Config{URL: url, Queue: q, Prefetch: 800})
	ctx := context.Background()
	b.ResetTimer()
	for got := 0; got < b.N; {
		msgs, err := src.Receive(ctx, 100)
		if err != nil {
			b.Fatal(err)
		}
		if err := src.Ack(ctx, msgs); err != nil {
			b.Fatal(err)
		}
		got += len(msgs)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
}

// Retry queues can be quorum queues with at-least-once dead-lettering, so
// that the trip back survives a broker crash.
func TestRetryThroughQuorumRetryQueue(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, quorum, 0)
	publish(t, url, q, outgoing("quorum-retry", 1)...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, RetryQueueArgs: map[string]any{
		"x-queue-type":           "quorum",
		"x-dead-letter-strategy": "at-least-once",
		"x-overflow":             "reject-publish",
	}})
	m := receive(t, src, 1, testTimeout)[0]
	if err := src.Retry(context.Background(), m, 100*time.Millisecond); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	back := receive(t, src, 1, backTimeout)[0]
	if back.Key != m.Key || back.Attempt != 2 {
		t.Fatalf("retried message came back as %q attempt %d, want %q attempt 2", back.Key, back.Attempt, m.Key)
	}
	if err := src.Ack(context.Background(), []*consumer.Message{back}); err != nil {
		t.Fatal(err)
	}
}

// RabbitMQ deletes a queue with x-expires that long after its last
// declaration, whatever it holds: publishing into it does not renew it. A
// retry queue has no consumer, so the source declares it again while it puts
// copies in it. Here the second copy goes in 2.2 s after the first
// declaration and leaves 1 s later, after the 3 s x-expires of that
// declaration: without a second declaration the broker deletes it with the
// queue. (Classic retry queues, whose expiry timer is exact; the redeclaring
// is the same for quorum ones.)
func TestRetryQueueWithExpiresOutlivesItsCopies(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	publish(t, url, q, outgoing("expires", 2)...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, ClassicRetryQueues: true,
		RetryQueueArgs: amqp.Table{"x-expires": int32(3000)}})
	ctx := context.Background()
	msgs := receive(t, src, 2, testTimeout)
	declared := time.Now()
	if err := src.Retry(ctx, msgs[0], time.Second); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	time.Sleep(time.Until(declared.Add(2200 * time.Millisecond)))
	if err := src.Retry(ctx, msgs[1], time.Second); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	back := receive(t, src, 2, backTimeout)
	if err := src.Ack(ctx, back); err != nil {
		t.Fatal(err)
	}
	// The x-expires is in force: 3 s after the last declaration (at the
	// second copy) the broker deleted the queue. A passive declaration
	// renews it too, so look once.
	time.Sleep(time.Until(declared.Add(2200*time.Millisecond + 4*time.Second)))
	retryQueue := amqpsource.RetryQueueName(q+".retry.", time.Second)
	err := withChannel(t, url, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(retryQueue, true, false, false, false, nil)
		return err
	})
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Fatalf("retry queue %s 4 s after its x-expires: passive declare = %v, want NOT_FOUND (deleted)", retryQueue, err)
	}
}
