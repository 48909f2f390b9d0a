package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// horizonSource is a memsource.Source whose broker reports a redelivery
// horizon.
type horizonSource struct {
	*memsource.Source
	horizon time.Duration
	err     error
}

func (s horizonSource) RedeliveryHorizon(context.Context) (time.Duration, error) {
	return s.horizon, s.err
}

// runBriefly runs r until one message is handled or Run returns, and returns
// the log and Run's error.
func runBriefly(t *testing.T, src horizonSource, path consumer.Path, allow bool) (string, error) {
	t.Helper()
	var logs runtest.SyncBuffer
	r := newRunner(t, src, path, consumer.Config{
		Name: "horizon", AllowShortRetention: allow,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	deadline := time.After(10 * time.Second)
	for r.Stats().Handled == 0 {
		select {
		case err := <-done:
			return logs.String(), err
		case <-deadline:
			t.Fatal("nothing handled and Run did not return")
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	return logs.String(), <-done
}

// The Runner compares the source's redelivery horizon with the store's
// retention when Run starts: longer refuses with both numbers, unless
// AllowShortRetention, which warns once; an unknown horizon warns, unless
// AllowShortRetention; unbounded (a queue the source declared without a
// TTL: known, and bounded in practice by how long no consumer runs) is
// said once at INFO with the fix; shorter or equal says nothing.
func TestRetentionGuard(t *testing.T) {
	const retention = 72 * time.Hour
	unknown := fmt.Errorf("queue not declared by the source: %w", consumer.ErrHorizonUnknown)
	cases := []struct {
		name      string
		horizon   time.Duration
		err       error
		allow     bool
		refuse    bool
		warn      []string
		info      []string
		lease     bool
		retention time.Duration
	}{
		{name: "horizon above retention", horizon: 96 * time.Hour, refuse: true},
		{name: "opted in", horizon: 96 * time.Hour, allow: true, warn: []string{"redelivery_horizon=96h0m0s", "dedup_retention=72h0m0s", "AllowShortRetention"}},
		{name: "equal", horizon: retention},
		{name: "below", horizon: time.Hour},
		{name: "unbounded", horizon: consumer.Unbounded, info: []string{"redelivery_horizon=unbounded", "dedup_retention=72h0m0s", "x-message-ttl"}},
		{name: "unknown", err: unknown, warn: []string{"not declared by the source", "dedup_retention=72h0m0s", "AllowShortRetention"}},
		{name: "unknown, opted in", err: unknown, allow: true, info: []string{"not declared by the source", "dedup_retention=72h0m0s"}},
		{name: "failed", err: errors.New("broker says no"), warn: []string{"broker says no", "dedup_retention=72h0m0s"}},
		{name: "lease path", horizon: 96 * time.Hour, refuse: true, lease: true, retention: retention},
		{name: "lease path long retention", horizon: 96 * time.Hour, lease: true, retention: 8 * 24 * time.Hour},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store, err := memdedup.New(memdedup.Config{Retention: retention})
			if err != nil {
				t.Fatal(err)
			}
			broker := memsource.New(memsource.Config{})
			broker.Publish("t", memsource.Outgoing{Key: "k", Body: []byte("{}")})
			src := horizonSource{Source: broker.Source("t"), horizon: c.horizon, err: c.err}
			path := consumer.Transactional(store, func(context.Context, *memdedup.Tx, *consumer.Message) error { return nil })
			if c.lease {
				path = consumer.Leased(store.Leases(), func(context.Context, *consumer.Message) error { return nil },
					consumer.LeaseOptions{Retention: c.retention})
			}
			logs, err := runBriefly(t, src, path, c.allow)
			if c.refuse {
				var ce *idemq.ConfigError
				if !errors.As(err, &ce) || !errors.Is(err, idemq.ErrInvalidConfig) ||
					!strings.Contains(err.Error(), "96h0m0s") || !strings.Contains(err.Error(), "72h0m0s") {
					t.Fatalf("Run = %v, want a *idemq.ConfigError naming 96h0m0s and 72h0m0s", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
			var warns, infos []string
			for _, l := range strings.Split(logs, "\n") {
				switch {
				case strings.Contains(l, "level=WARN"):
					warns = append(warns, l)
				case strings.Contains(l, "level=INFO") && strings.Contains(l, "dedup_retention="):
					infos = append(infos, l)
				}
			}
			for level, e := range map[string]struct {
				lines, want []string
			}{"WARN": {warns, c.warn}, "INFO": {infos, c.info}} {
				if len(e.want) == 0 {
					if len(e.lines) > 0 {
						t.Errorf("%s lines %q about the retention, want none", level, e.lines)
					}
					continue
				}
				if len(e.lines) != 1 {
					t.Fatalf("%d %s lines about the retention, want 1: %s", len(e.lines), level, logs)
				}
				for _, w := range e.want {
					if !strings.Contains(e.lines[0], w) {
						t.Errorf("%s %q does not mention %q", level, e.lines[0], w)
					}
				}
			}
		})
	}
}
