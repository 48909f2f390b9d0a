package kafkasource_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sourcetest"
)

// Kafka cut off for 14 s behind a proxy (every connection of the source,
// the broker's advertised address included, goes through it), with the
// default group and fetch backoffs: the source keeps trying at a short
// interval however long the outage lasts, logs a few lines a minute rather
// than one per attempt, and the runner handles a message produced during the
// outage soon after the broker answers again.
func TestBrokerOutageRecoversFast(t *testing.T) {
	t.Parallel() // its own topic, group and schema
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	if len(brokers) != 1 {
		t.Skip("the proxy stands for one broker")
	}
	topic := newTopic(t, brokers, 1)
	db := newTestDB(t)
	proxy := testenv.StartProxy(t, brokers[0])
	cfg := testConfig(t, []string{proxy.Addr()}, topic, runtest.UniqueName(t, "g"))
	cfg.JoinGroupBackoff = 0 // the default
	logs := testenv.NewLogRecorder()
	cfg.Logger = logs.Logger()
	cfg.Dialer = &kafka.Dialer{
		Timeout: 2 * time.Second,
		// Every broker address (the advertised one too) leads to the proxy.
		DialFunc: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, proxy.Addr())
		},
	}
	src := openSource(t, cfg)
	w := startWorker(t, src, db.path(nil), consumer.Config{Name: "outage", OutageThreshold: 3, OutageReminder: time.Hour, Logger: logs.Logger()})
	publish(t, brokers, topic, sourcetest.Outgoing{Key: "before", Body: []byte("x")})
	w.waitHandled(t, 1, waitTimeout)

	lines := len(logs.Find(""))
	rep := proxy.CutFor(t, 14*time.Second, 3*time.Second, func() {
		publish(t, brokers, topic, sourcetest.Outgoing{Key: "during", Body: []byte("y")})
	})
	kinds := map[string]int{}
	var warns int
	for _, rec := range logs.Find("")[lines:] {
		if rec.Level >= slog.LevelWarn {
			warns++
			kinds[rec.Message]++
		}
	}
	// At most, within a minute: 5 of kafka-go's error lines and 5 of its
	// commit loop's, 3 fetch failures, 2 failed receives and the outage.
	if warns > 16 {
		t.Errorf("%d WARN or ERROR lines during a 14 s outage, want at most 16 (rate-limited): %v", warns, kinds)
	}
	if rep.LateDials < 3 {
		t.Errorf("%d connection attempts to Kafka in the last 3 s of the outage, want at least 3 (a capped backoff)", rep.LateDials)
	}
	d := testenv.WaitRecovery(t, rep.Restored, 10*time.Second, func() bool { return w.runner.Stats().Handled >= 2 })
	t.Logf("Kafka: first message handled %v after the broker answered again", d.Round(time.Millisecond))
	if rows, keys := db.counts(t); rows != 2 || keys != 2 {
		t.Fatalf("%d effects of %d keys, want 2 of 2", rows, keys)
	}
}
