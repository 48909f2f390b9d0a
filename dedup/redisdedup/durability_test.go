package redisdedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
)

// privateRedis is a redis-server of one test's own, on a free loopback port
// with its data in a temporary directory, so that a test may give it any
// persistence settings and kill it without touching the shared Redis. It is
// killed when the test ends.
type privateRedis struct {
	Addr   string
	dir    string
	args   []string
	cmd    *exec.Cmd
	exited chan struct{}
}

// startRedis starts a private redis-server with the given extra arguments
// ("--appendonly", "yes", ...) and returns once it answers PING. It skips t
// with -short and when redis-server is not installed.
func startRedis(t testing.TB, args ...string) *privateRedis {
	t.Helper()
	if testing.Short() {
		t.Skip("needs redis-server; skipped with -short")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not found; run: bash testdata/services/services.sh up redis")
	}
	port := testenv.FreePort(t)
	r := &privateRedis{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: t.TempDir()}
	r.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--logfile", filepath.Join(r.dir, "redis.log")}, args...)
	t.Cleanup(r.kill)
	r.start(t)
	return r
}

func (r *privateRedis) start(t testing.TB) {
	t.Helper()
	r.cmd = exec.Command("redis-server", r.args...)
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	r.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(r.cmd, r.exited)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(30 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		select {
		case <-r.exited:
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			t.Fatalf("redis-server %v exited at start:\n%s", r.args, log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer within 30 s", r.Addr)
		}
	}
}

// crash SIGKILLs the server (no final save, no final fsync) and starts it
// again on the same port with the same data directory.
func (r *privateRedis) crash(t testing.TB) {
	t.Helper()
	r.kill()
	r.start(t)
}

func (r *privateRedis) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.exited
	r.cmd = nil
}

func (r *privateRedis) store(t testing.TB, cfg redisdedup.Config) *redisdedup.Store {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := redisdedup.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Durability reads what Redis keeps across a restart and a crash: a loss is
// reported for every setting but an fsync'ed append-only file, and for a
// Redis that hides appendfsync (CONFIG renamed away).
func TestDurabilityReadsPersistence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		settings string // in Durability.Settings
		loss     string // in Durability.Loss; "" for none
	}{
		{"no persistence", nil, "appendonly=no", "loses every record"},
		{"snapshots only", []string{"--save", "60 1"}, `save="60 1"`, "since its last RDB snapshot"},
		{"fsync no", []string{"--appendonly", "yes", "--appendfsync", "no"}, "appendfsync=no", "appendfsync is no"},
		{"fsync everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, "appendfsync=everysec", "about the last second"},
		{"fsync always", []string{"--appendonly", "yes", "--appendfsync", "always"}, "appendfsync=always", ""},
		{"CONFIG renamed", []string{"--appendonly", "yes", "--appendfsync", "always", "--rename-command", "CONFIG", ""}, "appendfsync=?", "could not be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startRedis(t, tc.args...).store(t, redisdedup.Config{})
			d, err := s.Durability(testContext(t))
			if err != nil {
				t.Fatalf("Durability: %v", err)
			}
			t.Logf("settings %q, loss %q", d.Settings, d.Loss)
			if !strings.Contains(d.Settings, tc.settings) {
				t.Errorf("Settings %q lack %q", d.Settings, tc.settings)
			}
			if tc.loss == "" && d.Loss != "" || !strings.Contains(d.Loss, tc.loss) {
				t.Errorf("Loss %q, want one containing %q", d.Loss, tc.loss)
			}
		})
	}
}

// With Config.RequireDurable, Durability refuses a Redis that can lose an
// acknowledged record, or that hides its settings, with a *idemq.ConfigError
// matching dedup.ErrNotDurable, and a Runner over it does not start; an
// fsync'ed append-only file passes.
func TestRequireDurableRefusesALossyRedis(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		args   []string
		refuse bool
	}{
		{"fsync everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, true},
		{"CONFIG renamed", []string{"--appendonly", "yes", "--appendfsync", "always", "--rename-command", "CONFIG", ""}, true},
		{"fsync always", []string{"--appendonly", "yes", "--appendfsync", "always"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startRedis(t, tc.args...).store(t, redisdedup.Config{RequireDurable: true})
			_, err := s.Durability(testContext(t))
			var ce *idemq.ConfigError
			switch {
			case !tc.refuse && err != nil:
				t.Fatalf("Durability: %v, want nil", err)
			case !tc.refuse:
			case !errors.Is(err, dedup.ErrNotDurable) || !errors.As(err, &ce) || ce.Field != "redisdedup.Config.RequireDurable":
				t.Fatalf("Durability: %v, want a *idemq.ConfigError on redisdedup.Config.RequireDurable matching dedup.ErrNotDurable", err)
			}

			b := memsource.New(memsource.Config{})
			defer b.Close()
			r, err := consumer.NewRunner(b.Source("in"), consumer.Leased(s, func(context.Context, *consumer.Message) error { return nil }, consumer.LeaseOptions{}),
				consumer.Config{Name: "durable", Logger: runtest.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			err = r.Run(ctx) // returns nil at the deadline once it runs
			if tc.refuse != errors.Is(err, dedup.ErrNotDurable) {
				t.Fatalf("Run = %v; refused: %v, want %v", err, errors.Is(err, dedup.ErrNotDurable), tc.refuse)
			}
		})
	}
}

// A Runner on the lease path over a Redis without persistence (the test
// Redis) says once, at start, that Redis can lose the records it
// acknowledged: one WARN line with the settings, and in Health (the
// readiness endpoint's JSON) for as long as it runs.
func TestRunnerWarnsOnceOfALossyRedis(t *testing.T) {
	s, rdb := newStore(t, redisdedup.Config{})
	if v, err := rdb.ConfigGet(testContext(t), "appendonly").Result(); err != nil || v["appendonly"] != "no" {
		t.Skipf("the test Redis has appendonly %v (%v); this test needs one without persistence", v, err)
	}
	var logs runtest.SyncBuffer
	b := memsource.New(memsource.Config{})
	defer b.Close()
	r, err := consumer.NewRunner(b.Source("in"), consumer.Leased(s, func(context.Context, *consumer.Message) error { return nil }, consumer.LeaseOptions{}),
		consumer.Config{Name: unique("lossy"), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop := runtest.Start(t, r)
	for i := range 3 {
		b.Publish("in", memsource.Outgoing{Key: fmt.Sprint("k", i)})
	}
	runtest.WaitFor(t, 10*time.Second, runtest.Say("3 messages handled"), func() bool { return r.Stats().Handled >= 3 })

	srv := httptest.NewServer(consumer.HealthHandler(r))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	var health map[string]any
	err = json.NewDecoder(resp.Body).Decode(&health)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	stop()

	if loss, _ := health["store_loss"].(string); !strings.Contains(loss, "append-only file") {
		t.Errorf("readyz %v: store_loss %q, want the loss named", health, loss)
	}
	if ready, _ := health["ready"].(bool); !ready {
		t.Errorf("readyz %v: not ready; a lossy store is a warning, not an outage", health)
	}
	var warns []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "appendonly=no") {
			warns = append(warns, l)
		}
	}
	if len(warns) != 1 {
		t.Errorf("%d WARN lines naming appendonly=no, want 1; logs:\n%s", len(warns), logs.String())
	}
}

// crashWriters is how many goroutines complete keys while Redis is killed,
// and crashAfter how long they run before the kill.
const (
	crashWriters = 8
	crashAfter   = 1500 * time.Millisecond
)

// Keys that Complete acknowledged before Redis was killed (SIGKILL: no final
// save, no final fsync) and started again are claimed again, as the
// redelivery of their messages would claim them: each claim that finds the
// key new would run its handler a second time. With appendonly yes and
// appendfsync always, none does. The other settings are measured and
// logged (docs/guarantees.md has the figures): a process crash leaves the
// kernel the pages Redis wrote, so only the settings without an append-only
// file lose records here; a machine crash, which this test cannot cause,
// also loses what everysec and no had not synced.
func TestCompletedKeysAcrossACrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		args    []string
		durable bool
	}{
		{"no persistence", nil, false},
		{"fsync no", []string{"--appendonly", "yes", "--appendfsync", "no"}, false},
		{"fsync everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, false},
		{"fsync always", []string{"--appendonly", "yes", "--appendfsync", "always"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			red := startRedis(t, tc.args...)
			s := red.store(t, redisdedup.Config{})
			acked, unanswered := completeUntilKilled(t, s, red)
			red.crash(t)
			s = red.store(t, redisdedup.Config{}) // a fresh pool: the old one backs off from its failed dials

			ctx := testContext(t)
			repeats := 0
			for _, key := range acked {
				c, err := s.Claim(ctx, "crash", dedup.Record{Key: key, PayloadHash: dedup.HashPayload([]byte(key))}, token(), 30*time.Second)
				if err != nil {
					t.Fatalf("claim %s after the crash: %v", key, err)
				}
				if c.State == dedup.StateNew {
					repeats++
				}
			}
			t.Logf("%s: %d keys completed and acknowledged before the kill (%d calls unanswered), %d of them new again after the restart (%.2f%%)",
				tc.name, len(acked), unanswered, repeats, 100*float64(repeats)/float64(max(len(acked), 1)))
			if len(acked) == 0 {
				t.Fatal("no key completed before the kill")
			}
			if tc.durable && repeats != 0 {
				t.Errorf("%d of %d acknowledged keys lost with appendfsync always", repeats, len(acked))
			}
		})
	}
}

// completeUntilKilled claims and completes fresh keys from crashWriters
// goroutines, SIGKILLs Redis after crashAfter while they run, and returns
// the keys whose Complete Redis acknowledged and the number of calls that
// got no answer.
func completeUntilKilled(t *testing.T, s *redisdedup.Store, red *privateRedis) (acked []string, unanswered int) {
	t.Helper()
	type result struct {
		acked      []string
		unanswered int
	}
	results := make(chan result, crashWriters)
	stop := make(chan struct{})
	for w := range crashWriters {
		go func() {
			var r result
			defer func() { results <- r }()
			ctx := context.Background()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				tok := token()
				c, err := s.Claim(ctx, "crash", dedup.Record{Key: key, PayloadHash: dedup.HashPayload([]byte(key))}, tok, 30*time.Second)
				if err == nil && c.State == dedup.StateNew {
					err = s.Complete(ctx, "crash", key, tok, time.Hour)
				}
				if err != nil {
					r.unanswered++
					return
				}
				r.acked = append(r.acked, key)
			}
		}()
	}
	time.Sleep(crashAfter)
	red.kill()
	close(stop)
	for range crashWriters {
		r := <-results
		acked = append(acked, r.acked...)
		unanswered += r.unanswered
	}
	return acked, unanswered
}
