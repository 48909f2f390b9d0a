package kafkaoutbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sinks/outbox/kafkaoutbox"
	"github.com/idemq/idemq/sources/kafkasource"
)

// TestHelperRelayChild is the relay process of TestRelayCrash. It does
// nothing when run on its own.
func TestHelperRelayChild(t *testing.T) {
	relaytest.ChildMain(t, func(t *testing.T) outbox.Publisher {
		pub, err := kafkaoutbox.New(kafkaoutbox.Config{Brokers: testenv.KafkaBrokers(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		return pub
	})
}

// TestRelayCrash kills the relay process with SIGKILL between the broker's
// confirm and the row update, many times, until every row is sent; then an
// idemq consumer (kafkasource + pgdedup) reads the topic: it sees duplicate
// deliveries, but applies every event exactly once and misses none.
func TestRelayCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; skipped with -short")
	}
	const (
		n     = 1000
		keys  = 8
		batch = 7
		kills = 40
	)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers)
	pool, schema, dbURL := relaytest.NewPool(t)
	want := relaytest.Messages("e", topic, n, keys)
	relaytest.Insert(t, pool, want)

	killed := relaytest.RunKills(t, pool, dbURL, []string{testenv.EnvKafkaBrokers + "=" + strings.Join(brokers, ",")}, kills, batch)
	t.Logf("%d relay processes SIGKILLed between confirm and update; %s", killed, relaytest.Describe(t, pool))
	// A relay that is not killed finishes the rest.
	relaytest.StartRelays(t, pool, newPublisher(t, brokers), 1, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == n
	})
	got := readAll(t, brokers, topic)
	dups := relaytest.Check(t, want, got, true)
	if dups == 0 {
		t.Fatalf("no duplicate deliveries in the topic after %d kills; the test proves nothing", killed)
	}
	t.Logf("topic holds %d messages for %d events: %d duplicates from the kills", len(got), n, dups)

	// The downstream consumer: effect and record in one transaction.
	ctx := context.Background()
	src, err := kafkasource.New(ctx, kafkasource.Config{Brokers: brokers, Topics: []string{topic}, GroupID: topic + "-downstream", Logger: relaytest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	relaytest.Downstream(t, pool, schema, src, 20, len(got), n)
}
