package amqpoutbox_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sources/amqpsource"
)

// TestHelperRelayChild is the relay process of TestRelayCrash. It does
// nothing when run on its own.
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

// queueDepth returns the number of ready messages in queue.
func queueDepth(t testing.TB, url, queue string) int {
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
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// TestRelayCrash kills the relay process with SIGKILL between RabbitMQ's
// publisher confirm and the row update, many times; an amqpsource +
// pgdedup consumer then sees duplicate deliveries but applies every event
// once and misses none.
func TestRelayCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; skipped with -short")
	}
	const (
		n     = 600
		keys  = 8
		batch = 7
		kills = 30
	)
	url := testenv.AMQPURL(t)
	exchange, _, queue := topology(t, url)
	pool, schema, dbURL := relaytest.NewPool(t)
	want := relaytest.Messages("e", exchange, n, keys)
	relaytest.Insert(t, pool, want)

	killed := relaytest.RunKills(t, pool, dbURL, []string{testenv.EnvAMQPURL + "=" + url}, kills, batch)
	t.Logf("%d relay processes SIGKILLed between confirm and update; %s", killed, relaytest.Describe(t, pool))
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	relaytest.StartRelays(t, pool, pub, 1, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == n
	})
	total := queueDepth(t, url, queue)
	if total <= n {
		t.Fatalf("queue holds %d messages for %d events after %d kills; the test proves nothing", total, n, killed)
	}
	t.Logf("queue holds %d messages for %d events: %d duplicates from the kills", total, n, total-n)

	ctx := context.Background()
	src, err := amqpsource.New(ctx, amqpsource.Config{URL: url, Queue: queue, Logger: relaytest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	relaytest.Downstream(t, pool, schema, src, 4, total, n)
}
