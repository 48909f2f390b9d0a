package leasepath_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
)

// These tests need go-redis and so live here, not in consumer: see the
// package doc.

// A Redis outage on the lease path (the lease store cut off behind a proxy
// for 8 s) is handled as a PostgreSQL one: receiving pauses, the store is
// probed at a short interval, the per-message WARN lines are rate-limited,
// and messages are handled again soon after Redis answers.
func TestLeaseStoreOutagePausesReceivingAndRecoversFast(t *testing.T) {
	redisURL, proxy := testenv.ProxyURL(t, testenv.RedisURL(t))
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = time.Second, time.Second, time.Second
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	store, err := redisdedup.New(rdb, redisdedup.Config{Prefix: "idemq-test:" + t.Name() + ":" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"})
	if err != nil {
		t.Fatal(err)
	}
	broker := memsource.New(memsource.Config{VisibilityTimeout: 30 * time.Second, Seed: 1})
	t.Cleanup(func() { _ = broker.Close() })
	const topic = "orders"
	var mu sync.Mutex
	calls := map[string]int{}
	path := consumer.Leased(store, func(ctx context.Context, msg *consumer.Message) error {
		mu.Lock()
		calls[msg.Key]++
		mu.Unlock()
		return nil
	}, consumer.LeaseOptions{})
	logs := testenv.NewLogRecorder()
	r, err := consumer.NewRunner(broker.Source(topic), path, consumer.Config{
		Name:        "robust",
		Concurrency: 1, BatchSize: 1,
		OutageThreshold: 3, OutageReminder: time.Hour,
		Retry:  consumer.RetryPolicy{InitialBackoff: 100 * time.Millisecond, Multiplier: 2, MaxBackoff: time.Minute},
		Logger: logs.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runtest.Start(t, r)
	broker.Publish(topic, memsource.Outgoing{Key: "before", Body: []byte("x")})
	runtest.WaitFor(t, 30*time.Second, runtest.Say("the first message handled"), func() bool { return r.Stats().Handled == 1 })

	ks := make([]string, 10)
	for i := range ks {
		ks[i] = fmt.Sprintf("cut-%d", i)
	}
	linesBefore := len(logs.Find(""))
	var received uint64
	rep := proxy.CutFor(t, 8*time.Second, 3*time.Second, func() {
		for _, k := range ks {
			broker.Publish(topic, memsource.Outgoing{Key: k, Body: []byte("x")})
		}
		runtest.WaitFor(t, 30*time.Second, runtest.Say("the outage declared"), func() bool { return len(logs.Find("dependency failing")) == 1 })
		time.Sleep(500 * time.Millisecond)
		received = r.Stats().Received
	})
	if got := r.Stats().Received - received; got > 1 {
		t.Errorf("received %d messages while the store was declared down, want at most 1 (back-pressure)", got)
	}
	var warns []testenv.LoggedRecord
	for _, rec := range logs.Find("")[linesBefore:] {
		if rec.Level == slog.LevelWarn {
			warns = append(warns, rec)
		}
	}
	if len(warns) > 4 {
		t.Errorf("%d WARN lines during the outage, want at most 4 (rate-limited); first: %q", len(warns), warns[0].Message)
	}
	if rep.LateDials < 3 {
		t.Errorf("%d connection attempts to Redis in the last 3 s of the outage, want at least 3 (a probe)", rep.LateDials)
	}
	handled := r.Stats().Handled
	d := testenv.WaitRecovery(t, rep.Restored, 10*time.Second, func() bool { return r.Stats().Handled > handled })
	t.Logf("Redis (lease path): first message handled %v after the store answered again", d.Round(time.Millisecond))
	runtest.WaitFor(t, 30*time.Second, runtest.Say("every message handled"), func() bool { return r.Stats().Handled == 11 })
	stop()
	mu.Lock()
	defer mu.Unlock()
	for _, k := range append(ks, "before") {
		if n := calls[k]; n != 1 {
			t.Errorf("key %s: handler ran %d times, want 1", k, n)
		}
	}
}

// A store whose New failed and whose error was ignored is a typed nil: the
// path's interface holds a nil pointer. NewRunner reports it as a
// *ConfigError instead of passing it on to crash a lane in Run. The
// transactional stores' cases are in consumer's test of the same name.
func TestTypedNilStoresAreConfigErrors(t *testing.T) {
	src := memsource.New(memsource.Config{}).Source("t")
	paths := map[string]consumer.Path{
		"redisdedup": consumer.Leased((*redisdedup.Store)(nil), func(context.Context, *consumer.Message) error { return nil },
			consumer.LeaseOptions{}),
	}
	for name, p := range paths {
		t.Run(name, func(t *testing.T) {
			var ce *idemq.ConfigError
			defer func() {
				if v := recover(); v != nil {
					t.Fatalf("NewRunner with a nil *%s.Store panicked: %v", name, v)
				}
			}()
			if _, err := consumer.NewRunner(src, p, consumer.Config{Name: "x"}); !errors.As(err, &ce) {
				t.Fatalf("NewRunner with a nil *%s.Store = %v, want a *ConfigError", name, err)
			}
		})
	}
}
