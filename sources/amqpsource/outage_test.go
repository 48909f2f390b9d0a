package amqpsource_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/amqpsource"
)

// RabbitMQ cut off for 14 s behind a proxy, with the default reconnect
// settings: the source keeps trying to reconnect at a short interval however
// long the outage lasts, logs a few WARN lines rather than one per attempt,
// and the runner handles a message published during the outage within a
// second or so of the broker answering. An exponential reconnect backoff up
// to 15 s left the end of such an outage without a single attempt.
func TestBrokerOutageRecoversFast(t *testing.T) {
	url := brokerURL(t)
	db := newDatabase(t)
	q := newQueue(t, url, quorum, 0)
	proxied, proxy := testenv.ProxyURL(t, url)
	logs := testenv.NewLogRecorder()
	src := newSource(t, amqpsource.Config{URL: proxied, Queue: q, Logger: logs.Logger()})
	r, err := consumer.NewRunner(src, consumer.Transactional(db.store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return apply(ctx, tx, m.Key)
	}), consumer.Config{Name: "outage", OutageThreshold: 3, OutageReminder: time.Hour, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	stop := runtest.Start(t, r)
	defer stop()
	publish(t, url, q, outgoing("before", 1)...)
	runtest.WaitFor(t, testTimeout, runtest.Say("the first message handled"), func() bool { return r.Stats().Handled == 1 })

	lines := len(logs.Find(""))
	rep := proxy.CutFor(t, 14*time.Second, 3*time.Second, func() {
		publish(t, url, q, outgoing("during", 1)...)
	})
	var warns int
	for _, rec := range logs.Find("")[lines:] {
		if rec.Level == slog.LevelWarn {
			warns++
		}
	}
	if warns > 5 {
		t.Errorf("%d WARN lines during the outage, want at most 5 (rate-limited)", warns)
	}
	if rep.LateDials < 3 {
		t.Errorf("%d connection attempts to RabbitMQ in the last 3 s of the outage, want at least 3 (a capped backoff)", rep.LateDials)
	}
	d := testenv.WaitRecovery(t, rep.Restored, 10*time.Second, func() bool { return r.Stats().Handled >= 2 })
	t.Logf("RabbitMQ: first message handled %v after the broker answered again", d.Round(time.Millisecond))
	stop()
	db.requireExactlyOnce(t, []string{"before-0000", "during-0000"})
}
