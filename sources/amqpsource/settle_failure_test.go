package amqpsource_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/amqpsource"
)

// declareQueue declares a durable queue with args, deleted when t ends.
func declareQueue(t *testing.T, url, name string, args amqp.Table) {
	t.Helper()
	err := withChannel(t, url, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, args)
		return err
	})
	if err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = withChannel(t, url, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(name, false, false, false)
			return err
		})
	})
}

// A Retry whose copy cannot be published (here the retry queue exists with
// other arguments, so its declaration is refused) must not pin the delivery:
// with Prefetch 1 the consumer would otherwise never get another message.
func TestFailedRetryReleasesDelivery(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	declareQueue(t, url, amqpsource.RetryQueueName(q+".retry.", 100*time.Millisecond), amqp.Table{"x-message-ttl": int64(12345)})
	out := outgoing("retry-fails", 2)
	publish(t, url, q, out...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 1, UnroutableDelay: 300 * time.Millisecond})

	first := receive(t, src, 1, testTimeout)[0]
	start := time.Now()
	err := src.Retry(context.Background(), first, 100*time.Millisecond)
	if err == nil || errors.Is(err, amqpsource.ErrStaleDelivery) {
		t.Fatalf("Retry into a retry queue with conflicting arguments = %v, want a declaration error", err)
	}
	t.Logf("Retry: %v", err)
	// The delivery comes back (classic queues requeue at the head), held
	// back first so that a copy failing every time does not loop hot.
	back := receive(t, src, 1, backTimeout)[0]
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Errorf("released after %s, want at least the retry delay", waited)
	}
	if back.Key != first.Key || !back.Redelivered {
		t.Fatalf("got %q redelivered %v, want %q redelivered", back.Key, back.Redelivered, first.Key)
	}
	runtest.WaitFor(t, 5*time.Second, runtest.Say("Stats().Released = 1"), func() bool { return src.Stats().Released == 1 })
	if err := src.Ack(context.Background(), []*consumer.Message{back}); err != nil {
		t.Fatal(err)
	}
	second := receive(t, src, 1, backTimeout)[0]
	if second.Key != out[1].Key {
		t.Fatalf("next message is %q, want %q", second.Key, out[1].Key)
	}
	if err := src.Ack(context.Background(), []*consumer.Message{second}); err != nil {
		t.Fatal(err)
	}
	runtest.ExpectNothing(t, src, 300*time.Millisecond)
}

// A DeadLetter whose copy the broker refuses (a negative confirm: the
// dead-letter queue is full and rejects publishes) releases the delivery
// too, and DeadLetter says the copy was not confirmed.
func TestNegativelyConfirmedDeadLetterReleasesDelivery(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	full := q + ".full"
	declareQueue(t, url, full, amqp.Table{"x-max-length": int64(0), "x-overflow": "reject-publish"})
	publish(t, url, q, outgoing("dl-nacked", 1)...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 1,
		DeadLetterRoutingKey: full, UnroutableDelay: 200 * time.Millisecond})

	m := receive(t, src, 1, testTimeout)[0]
	err := src.DeadLetter(context.Background(), m, errors.New("poison"))
	if !errors.Is(err, amqpsource.ErrNotConfirmed) || errors.Is(err, amqpsource.ErrUnroutable) {
		t.Fatalf("DeadLetter to a full queue = %v, want ErrNotConfirmed", err)
	}
	back := receive(t, src, 1, backTimeout)[0]
	if back.Key != m.Key || !back.Redelivered {
		t.Fatalf("got %q redelivered %v, want %q redelivered", back.Key, back.Redelivered, m.Key)
	}
	runtest.WaitFor(t, 5*time.Second, runtest.Say("Stats().Released = 1"), func() bool { return src.Stats().Released == 1 })
	if got := src.Stats().Unroutable; got != 0 {
		t.Errorf("Stats().Unroutable = %d, want 0", got)
	}
	if err := src.Ack(context.Background(), []*consumer.Message{back}); err != nil {
		t.Fatal(err)
	}
}

// A publishing channel that the broker closes during a dead-letter publish
// (here: publishing to an internal exchange is refused) is not a returned,
// unroutable copy: DeadLetter reports the close, does not park the message,
// and releases the delivery.
func TestClosedPublishingChannelIsNotUnroutable(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	internal := q + ".internal"
	err := withChannel(t, url, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(internal, amqp.ExchangeDirect, false, true, true, false, nil)
	})
	if err != nil {
		t.Fatalf("declare internal exchange: %v", err)
	}
	publish(t, url, q, outgoing("dl-closed", 1)...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 1,
		DeadLetterExchange: internal, UnroutableDelay: 200 * time.Millisecond})

	m := receive(t, src, 1, testTimeout)[0]
	err = src.DeadLetter(context.Background(), m, errors.New("poison"))
	if !errors.Is(err, amqpsource.ErrPublishChannelClosed) || errors.Is(err, amqpsource.ErrUnroutable) {
		t.Fatalf("DeadLetter to an internal exchange = %v, want ErrPublishChannelClosed", err)
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
		t.Errorf("DeadLetter error %v does not carry the broker's ACCESS_REFUSED", err)
	}
	back := receive(t, src, 1, backTimeout)[0]
	if back.Key != m.Key || back.Attempt != m.Attempt {
		t.Fatalf("got %q attempt %d, want %q attempt %d (requeued, not parked)", back.Key, back.Attempt, m.Key, m.Attempt)
	}
	runtest.WaitFor(t, 5*time.Second, runtest.Say("Stats().Released = 1"), func() bool { return src.Stats().Released == 1 })
	if got := src.Stats().Unroutable; got != 0 {
		t.Errorf("Stats().Unroutable = %d, want 0", got)
	}
	// The publishing channel is replaced: the next copy goes out.
	if err := src.Retry(context.Background(), back, 100*time.Millisecond); err != nil {
		t.Fatalf("Retry after the publishing channel closed: %v", err)
	}
	again := receive(t, src, 1, backTimeout)[0]
	if err := src.Ack(context.Background(), []*consumer.Message{again}); err != nil {
		t.Fatal(err)
	}
}

// A dead-letter exchange that does not exist is an unroutable destination,
// like a missing queue: the message is parked, not dropped, not pinned.
func TestMissingDeadLetterExchangeIsParked(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	publish(t, url, q, outgoing("dl-noexchange", 1)...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 1,
		DeadLetterExchange: q + ".no-such-exchange", UnroutableDelay: 200 * time.Millisecond})

	m := receive(t, src, 1, testTimeout)[0]
	err := src.DeadLetter(context.Background(), m, errors.New("poison"))
	if !errors.Is(err, amqpsource.ErrUnroutable) {
		t.Fatalf("DeadLetter to a missing exchange = %v, want ErrUnroutable", err)
	}
	back := receive(t, src, 1, backTimeout)[0]
	if back.Key != m.Key || back.Attempt != m.Attempt+1 {
		t.Fatalf("parked message came back as %q attempt %d, want %q attempt %d", back.Key, back.Attempt, m.Key, m.Attempt+1)
	}
	if got := src.Stats(); got.Unroutable != 1 || got.Released != 0 {
		t.Errorf("Stats() = %+v, want Unroutable 1 and Released 0", got)
	}
	if err := src.Ack(context.Background(), []*consumer.Message{back}); err != nil {
		t.Fatal(err)
	}
}

// While a delivery whose copy failed waits to be handed back, acknowledging
// the deliveries after it must not cover it with a multiple-ack, and Close
// returns it to the queue.
func TestHeldDeliveryIsNotCoveredByLaterAcks(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	declareQueue(t, url, amqpsource.RetryQueueName(q+".retry.", time.Second), amqp.Table{"x-message-ttl": int64(12345)})
	out := outgoing("held", 3)
	publish(t, url, q, out...)
	// The default UnroutableDelay (1 min) outlives the test: the first
	// delivery is still held when the others are acknowledged and on Close.
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 3})
	msgs := receive(t, src, 3, testTimeout)
	if err := src.Retry(context.Background(), msgs[0], time.Second); err == nil {
		t.Fatal("Retry into a retry queue with conflicting arguments succeeded")
	}
	if err := src.Ack(context.Background(), msgs[1:]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if got := src.Stats().Released; got != 0 {
		t.Errorf("Stats().Released = %d before the hold ended, want 0", got)
	}
	next := newSource(t, amqpsource.Config{URL: url, Queue: q})
	back := receive(t, next, 1, backTimeout)
	if back[0].Key != out[0].Key {
		t.Fatalf("queue holds %q, want the held %q", back[0].Key, out[0].Key)
	}
	if err := next.Ack(context.Background(), back); err != nil {
		t.Fatal(err)
	}
	runtest.ExpectNothing(t, next, 300*time.Millisecond)
}

// Through the Runner: with Prefetch 1, a message whose retry copy is refused
// used to hold the only prefetch slot until the broker's consumer_timeout,
// so nothing else was consumed. It now comes back after the hold and the
// queue drains.
func TestRunnerKeepsConsumingWhenRetryCopyFails(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	db := newDatabase(t)
	q := newQueue(t, url, classic, 0)
	declareQueue(t, url, amqpsource.RetryQueueName(q+".retry.", 100*time.Millisecond), amqp.Table{"x-message-ttl": int64(12345)})
	out := outgoing("runner-retry-fails", 3)
	publish(t, url, q, out...)

	var mu sync.Mutex
	calls := map[string]int{}
	rc := consumer.Config{
		Name: "retry-fails", Concurrency: 1, BatchSize: 1,
		Retry: consumer.RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond, Jitter: -1},
	}
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 1, UnroutableDelay: 500 * time.Millisecond})
	r, err := consumer.NewRunner(src, consumer.Transactional(db.store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		calls[m.Key]++
		n := calls[m.Key]
		mu.Unlock()
		if m.Key == out[0].Key && n == 1 {
			return errors.New("transient failure")
		}
		return apply(ctx, tx, m.Key)
	}), rc)
	if err != nil {
		t.Fatal(err)
	}
	stop := runtest.Start(t, r)
	runtest.WaitFor(t, 20*time.Second, runtest.Say("3 messages handled"), func() bool { return r.Stats().Handled == 3 })
	stop()

	db.requireExactlyOnce(t, keysOf(out))
	if got := src.Stats().Released; got != 1 {
		t.Errorf("source Stats().Released = %d, want 1", got)
	}
	if s := r.Stats(); s.SettleFailures != 1 || s.DeadLettered != 0 {
		t.Errorf("runner stats %+v, want 1 settle failure (the refused retry) and no dead letters", s)
	}
	if d := queueDepth(t, url, q); d != 0 {
		t.Errorf("%d messages left in the queue", d)
	}
}

// On a quorum queue the hand-back counts as a failed delivery: Attempt
// grows, so the Runner's MaxAttempts and the queue's delivery limit bound a
// message whose copies keep failing.
func TestRequeueAfterFailedCopyCountsOnQuorumQueue(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, quorum, 0)
	declareQueue(t, url, amqpsource.RetryQueueName(q+".retry.", 100*time.Millisecond), amqp.Table{"x-message-ttl": int64(12345)})
	publish(t, url, q, outgoing("quorum-requeue", 1)...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 1, UnroutableDelay: 200 * time.Millisecond})

	m := receive(t, src, 1, testTimeout)[0]
	if err := src.Retry(context.Background(), m, 100*time.Millisecond); err == nil {
		t.Fatal("Retry into a retry queue with conflicting arguments succeeded")
	}
	back := receive(t, src, 1, backTimeout)[0]
	if back.Key != m.Key || back.Attempt != m.Attempt+1 || !back.Redelivered {
		t.Fatalf("got %q attempt %d redelivered %v, want %q attempt %d redelivered",
			back.Key, back.Attempt, back.Redelivered, m.Key, m.Attempt+1)
	}
	if err := src.Ack(context.Background(), []*consumer.Message{back}); err != nil {
		t.Fatal(err)
	}
}
