package sqssource_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sqssource"
)

// The SQS endpoint cut off for 12 s behind a proxy: the runner keeps trying
// to receive at a short interval however long the outage lasts, logs the
// outage once instead of one WARN per failed receive, and handles a message
// sent during the outage within a second or so of the endpoint answering.
// The retry policy here would have grown the receive backoff to a minute.
func TestEndpointOutageRecoversFast(t *testing.T) {
	needServices(t)
	q := newQueue(t, queueOptions{})
	db := newDatabase(t)
	endpoint, proxy := testenv.ProxyURL(t, testenv.SQSEndpoint(t))
	c, err := newClient(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	src, err := sqssource.New(testContext(t, 30*time.Second), c, sourceConfig(t, q))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	logs := testenv.NewLogRecorder()
	r := startRunner(t, src, consumerTransactional(db), consumer.Config{
		OutageThreshold: 3, OutageReminder: time.Hour, Logger: logs.Logger(),
		Retry: consumer.RetryPolicy{InitialBackoff: time.Second, Multiplier: 8, MaxBackoff: time.Minute},
	})
	publish(t, q.URL, false, outMsg{Key: "before", Body: "x"})
	waitEffects(t, db, 1)

	lines := len(logs.Find(""))
	rep := proxy.CutFor(t, 12*time.Second, 3*time.Second, func() {
		publish(t, q.URL, false, outMsg{Key: "during", Body: "y"})
	})
	var warns int
	for _, rec := range logs.Find("")[lines:] {
		if rec.Level == slog.LevelWarn {
			warns++
		}
	}
	if warns > 4 {
		t.Errorf("%d WARN lines during the outage, want at most 4 (rate-limited)", warns)
	}
	if rep.LateDials < 3 {
		t.Errorf("%d connection attempts to SQS in the last 3 s of the outage, want at least 3 (a capped backoff)", rep.LateDials)
	}
	d := testenv.WaitRecovery(t, rep.Restored, 10*time.Second, func() bool { return r.Stats().Handled >= 2 })
	t.Logf("SQS: first message handled %v after the endpoint answered again", d.Round(time.Millisecond))
	if rows, keys := effectCounts(t, db); rows != 2 || keys != 2 {
		t.Fatalf("%d effects of %d keys, want 2 of 2", rows, keys)
	}
}

func consumerTransactional(db database) consumer.Path {
	return consumer.Transactional(db.Store, recordEffect("w"))
}

// waitEffects waits until db holds n effect rows.
func waitEffects(t *testing.T, db database, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if rows, _ := effectCounts(t, db); rows >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d effects after 20 s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
