package consumer_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// warnsAfter returns the WARN lines recorded after the first n lines.
func warnsAfter(logs *testenv.LogRecorder, n int) []testenv.LoggedRecord {
	var out []testenv.LoggedRecord
	for _, rec := range logs.Find("")[n:] {
		if rec.Level == slog.LevelWarn {
			out = append(out, rec)
		}
	}
	return out
}

// A PostgreSQL outage (the store cut off behind a proxy for 8 s): the
// runner stops receiving once the outage is declared (back-pressure), probes
// the store at a short interval instead of cycling messages through
// infrastructure retries, logs one ERROR line and no WARN line per failed
// transaction, and handles messages again within a second or so of the
// database answering. The retry policy's backoff would otherwise have grown
// past the recovery bound.
func TestStoreOutagePausesReceivingAndRecoversFast(t *testing.T) {
	f := newFixture(t)
	dbURL, proxy := testenv.ProxyURL(t, testenv.DatabaseURL(t))
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: f.store.Config().Schema})
	if err != nil {
		t.Fatal(err)
	}

	logs := testenv.NewLogRecorder()
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(store, f.handler(nil)), consumer.Config{
		Concurrency: 1, BatchSize: 1,
		OutageThreshold: 3, OutageReminder: time.Hour,
		Retry:  consumer.RetryPolicy{InitialBackoff: 100 * time.Millisecond, Multiplier: 2, MaxBackoff: time.Minute},
		Logger: logs.Logger(),
	})
	f.publish("before")
	until(t, "the first message handled", func() bool { return r.Stats().Handled == 1 })

	keys := keys(10, "cut-")
	linesBefore := len(logs.Find(""))
	var received uint64
	rep := proxy.CutFor(t, 8*time.Second, 3*time.Second, func() {
		f.publish(keys...)
		until(t, "the outage declared", func() bool { return len(logs.Find("dependency failing")) == 1 })
		time.Sleep(500 * time.Millisecond) // what the lane held fails and goes back
		received = r.Stats().Received
	})
	if got := r.Stats().Received - received; got > 1 {
		t.Errorf("received %d messages while the store was declared down, want at most 1 (back-pressure)", got)
	}
	if w := warnsAfter(logs, linesBefore); len(w) > 4 {
		t.Errorf("%d WARN lines during the outage, want at most 4 (rate-limited); first: %q", len(w), w[0].Message)
	}
	if rep.LateDials < 3 {
		t.Errorf("%d connection attempts to the store in the last 3 s of the outage, want at least 3 (a probe)", rep.LateDials)
	}
	handled := r.Stats().Handled
	d := testenv.WaitRecovery(t, rep.Restored, 10*time.Second, func() bool { return r.Stats().Handled > handled })
	t.Logf("PostgreSQL: first message handled %v after the store answered again", d.Round(time.Millisecond))
	f.settled()
	f.requireOnce(append(keys, "before")...)
}

// A store that loses its table while the runner runs is an outage: the
// runner logs the outage and its transitions, not one line per message
// and retry. With one message per transaction, a line per message would be
// a line per failure.
func TestStoreOutageLogsNoLinePerMessage(t *testing.T) {
	f := newFixture(t)
	rec := testenv.NewLogRecorder()
	const threshold = 2
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(nil)),
		consumer.Config{OutageThreshold: threshold, OutageReminder: time.Hour, Concurrency: 1, BatchSize: 1, Logger: rec.Logger()})
	f.publish("warm")
	f.waitFor("the first message", func(st memsource.TopicStats) bool { return st.Acks == 1 })
	f.exec(`DROP TABLE ` + pgx.Identifier{f.store.Config().Schema, f.store.Config().Table}.Sanitize())
	f.publish(keys(20, "k")...)
	deadline := time.Now().Add(30 * time.Second)
	for r.Health().StoreFailures < 30 {
		if time.Now().After(deadline) {
			t.Fatalf("store failures = %d after 30 s, want 30", r.Health().StoreFailures)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.stop()
	t.Logf("%d store failures: %d lines \"message will be retried\", %d \"receiving paused\"",
		r.Health().StoreFailures, len(rec.Find("message will be retried")), len(rec.Find("receiving paused")))
	// Before the outage is declared, each failure may have its line.
	if n := len(rec.Find("message will be retried")); n > threshold {
		t.Errorf("%d lines \"message will be retried\" for %d store failures; want at most %d", n, r.Health().StoreFailures, threshold)
	}
	if n := len(rec.Find("receiving paused")); n > 1 {
		t.Errorf("%d lines \"receiving paused\" in one outage; want 1", n)
	}
	if n := len(rec.Find("dependency failing")); n != 1 {
		t.Errorf("%d lines \"dependency failing\"; want 1", n)
	}
}
