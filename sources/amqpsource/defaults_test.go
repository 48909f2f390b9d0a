package amqpsource_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/amqpsource"
)

// With the default configuration, a RabbitMQ restart while retry copies are
// expiring loses nothing: the retry queues are quorum queues that
// dead-letter at least once, so every copy that expires around the restart
// reaches the source queue. (With classic retry queues, copies that expire
// while the broker stops are dropped.) Every message fails its first
// attempt, its retry copy waits between 0.5 s and 10 s, and the broker is
// restarted once a third of the messages are in retry queues. Not parallel:
// the other tests of the package would see the restart.
func TestDefaultConfigSurvivesBrokerRestart(t *testing.T) {
	url := brokerURL(t)
	db := newDatabase(t)
	q := newQueue(t, url, quorum, 0) // Declare's defaults
	const n = 3000
	out := outgoing("restart", n)
	publish(t, url, q, out...)

	delays := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second}
	var mu sync.Mutex
	failed := map[string]bool{}
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Logger: runtest.Logger(t)})
	r, err := consumer.NewRunner(src, consumer.Transactional(db.store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		first := !failed[m.Key]
		failed[m.Key] = true
		mu.Unlock()
		if first {
			var i int
			_, _ = fmt.Sscanf(m.Key, "restart-%d", &i)
			return consumer.RetryAfter(delays[i%len(delays)], errors.New("first attempt fails"))
		}
		return apply(ctx, tx, m.Key)
	}), consumer.Config{Name: "restart", Logger: runtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runtest.Start(t, r)
	runtest.WaitFor(t, 2*testTimeout, runtest.Say("a third of the messages in retry queues"), func() bool { return r.Stats().Retried >= n/3 })
	before := r.Stats()
	testenv.Restart(t, testenv.RabbitMQ)
	t.Logf("restarted RabbitMQ; before: %+v", before)

	keys := keysOf(out)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got := db.effects(t)
		if len(got) == n {
			break
		}
		if time.Now().After(deadline) {
			var missing []string
			for _, k := range keys {
				if got[k] == 0 {
					missing = append(missing, k)
				}
			}
			t.Fatalf("%d of %d messages never handled after the restart (stats %+v): %s", len(missing), n, r.Stats(), strings.Join(missing[:min(len(missing), 20)], " "))
		}
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	t.Logf("after: %+v; source %+v", r.Stats(), src.Stats())
	db.requireExactlyOnce(t, keys)
	if dl := peek(t, url, q+".dlq"); len(dl) != 0 {
		t.Errorf("%d dead letters, want none: first reason %q", len(dl), amqpsource.DeadLetterReason(dl[0].Headers))
	}
}

// The retry queues are quorum queues with at-least-once dead-lettering by
// default.
func TestRetryQueuesAreAtLeastOnceByDefault(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	publish(t, url, q, outgoing("alo", 1)...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q})
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
	// Declaring the retry queue as a classic queue now conflicts: it is a
	// quorum queue with the at-least-once arguments.
	name := amqpsource.RetryQueueName(q+".retry.", 100*time.Millisecond)
	err := withChannel(t, url, func(ch *amqp.Channel) error {
		args := amqpsource.RetryQueueDefaults()
		args["x-message-ttl"] = int64(100)
		args["x-dead-letter-exchange"] = ""
		args["x-dead-letter-routing-key"] = q
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			return fmt.Errorf("re-declare with the default arguments: %w", err)
		}
		_, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{
			"x-message-ttl": int64(100), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": q,
		})
		if err == nil {
			return errors.New("a classic declaration of the retry queue was accepted")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// RetryQueueArgs that would make the retry queues at-most-once are refused
// unless ClassicRetryQueues opts into that; the opt-out declares classic
// retry queues.
func TestRetryQueueArgsCannotDegradeSilently(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	for _, args := range []amqp.Table{
		{"x-queue-type": "classic"},
		{"x-dead-letter-strategy": "at-most-once"},
		{"x-overflow": "drop-head"},
		{"x-expires": int32(3_600_000)},
	} {
		_, err := amqpsource.New(context.Background(), amqpsource.Config{URL: url, Queue: q, RetryQueueArgs: args})
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != "amqpsource.Config.RetryQueueArgs" || !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("New with RetryQueueArgs %v = %v, want a RetryQueueArgs *idemq.ConfigError", args, err)
		}
	}

	publish(t, url, q, outgoing("classic", 1)...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, ClassicRetryQueues: true})
	m := receive(t, src, 1, testTimeout)[0]
	if err := src.Retry(context.Background(), m, 100*time.Millisecond); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	back := receive(t, src, 1, backTimeout)[0]
	if err := src.Ack(context.Background(), []*consumer.Message{back}); err != nil {
		t.Fatal(err)
	}
	name := amqpsource.RetryQueueName(q+".retry.", 100*time.Millisecond)
	err := withChannel(t, url, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{
			"x-message-ttl": int64(100), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": q,
		})
		return err
	})
	if err != nil {
		t.Fatalf("the opt-out's retry queue is not a plain classic queue: %v", err)
	}
}

// A quorum queue declared with the defaults dead-letters a message that
// crash-loops its consumers only after DefaultDeliveryLimit returns, far
// above the Runner's MaxAttempts; a lower limit dead-letters through the
// same route as idemq's dead letters, with a reason DeadLetterReason reads.
func TestBrokerDeadLettersLandInTheDeadLetterQueue(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, quorum, 0)
	var args amqp.Table
	err := withChannel(t, url, func(ch *amqp.Channel) error {
		// Re-declaring with the arguments Declare's defaults use succeeds
		// only if the queue was declared with exactly these.
		args = amqp.Table{
			"x-queue-type": "quorum", "x-delivery-limit": int64(amqpsource.DefaultDeliveryLimit),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q + ".dlq",
			"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
		}
		_, err := ch.QueueDeclare(q, true, false, false, false, args)
		return err
	})
	if err != nil {
		t.Fatalf("the default topology is not a quorum queue with delivery limit %d and at-least-once dead-lettering: %v", amqpsource.DefaultDeliveryLimit, err)
	}

	const limit = 2
	ql := newQueue(t, url, quorum, limit)
	publish(t, url, ql, outgoing("crash", 1)...)
	for i := 0; len(peek(t, url, ql+".dlq")) == 0; i++ {
		if i > limit+1 {
			t.Fatalf("returned %d times with x-delivery-limit %d and not dead-lettered", i, limit)
		}
		src := newSource(t, amqpsource.Config{URL: url, Queue: ql})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = src.Receive(ctx, 1)
		cancel()
		_ = src.Close() // a crash: the delivery goes back unsettled
	}
	dl := peek(t, url, ql+".dlq")
	reason := amqpsource.DeadLetterReason(dl[0].Headers)
	if want := "broker: delivery_limit in queue " + ql; reason != want {
		t.Fatalf("DeadLetterReason = %q, want %q", reason, want)
	}
	if dl[0].Headers[amqpsource.DefaultKeyHeader] != "crash-0000" {
		t.Errorf("dead letter lost its key header: %v", dl[0].Headers)
	}
	t.Logf("broker dead letter: %s", reason)
}

// A classic retry queue left by an older configuration makes Retry fail with
// an error that says what to do, and the original is handed back, not lost.
func TestOldClassicRetryQueueIsExplained(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	declareQueue(t, url, amqpsource.RetryQueueName(q+".retry.", 100*time.Millisecond), amqp.Table{
		"x-message-ttl": int64(100), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": q,
	})
	publish(t, url, q, outgoing("old", 1)...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, UnroutableDelay: 300 * time.Millisecond})
	m := receive(t, src, 1, testTimeout)[0]
	err := src.Retry(context.Background(), m, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "exists with other arguments") || !strings.Contains(err.Error(), "ClassicRetryQueues") {
		t.Fatalf("Retry into an old classic retry queue = %v, want an error naming the way out", err)
	}
	back := receive(t, src, 1, backTimeout)[0]
	if back.Key != m.Key {
		t.Fatalf("got %q back, want %q", back.Key, m.Key)
	}
}

// BenchmarkRetry measures what at-least-once retry queues cost against the
// classic opt-out: each iteration receives a message, publishes its retry
// copy to the 100 ms retry queue (waiting for the broker's confirm) and
// acknowledges the original.
func BenchmarkRetry(b *testing.B) {
	url := brokerURL(b)
	for _, classicQueues := range []bool{false, true} {
		name := "quorum"
		if classicQueues {
			name = "classic"
		}
		b.Run(name, func(b *testing.B) {
			q := newQueue(b, url, classic, 0)
			out := outgoing("bench", b.N)
			for i := 0; i < len(out); i += 5000 {
				publish(b, url, q, out[i:min(i+5000, len(out))]...)
			}
			src := newSource(b, amqpsource.Config{URL: url, Queue: q, Prefetch: 64, ClassicRetryQueues: classicQueues})
			ctx := context.Background()
			b.ResetTimer()
			for got := 0; got < b.N; {
				msgs, err := src.Receive(ctx, 64)
				if err != nil {
					b.Fatal(err)
				}
				for _, m := range msgs {
					if m.Attempt > 1 {
						if err := src.Ack(ctx, []*consumer.Message{m}); err != nil {
							b.Fatal(err)
						}
						continue
					}
					if err := src.Retry(ctx, m, 100*time.Millisecond); err != nil {
						b.Fatal(err)
					}
					got++
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "retries/s")
		})
	}
}
