package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/memdedup"
)

// outageConfig makes outages show after 3 failures, with one ERROR line per
// outage (no reminder within the test) and quick retries.
func outageConfig(logs *logBuffer) consumer.Config {
	return consumer.Config{
		OutageThreshold: 3,
		OutageReminder:  time.Hour,
		Logger:          logs.logger(),
		Retry:           consumer.RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond},
	}
}

// wantOutageLines checks the outage lines of one dependency: exactly one
// ERROR line naming it and the error, and one INFO line for the recovery.
func wantOutageLines(t *testing.T, logs *logBuffer, dep, errText string) {
	t.Helper()
	var failing, recovered int
	for _, line := range strings.Split(logs.String(), "\n") {
		if !strings.Contains(line, "dependency="+quoteIfNeeded(dep)) {
			continue
		}
		switch {
		case strings.Contains(line, `msg="dependency failing"`):
			failing++
			if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, errText) {
				t.Errorf("outage line without ERROR level or the error %q: %s", errText, line)
			}
		case strings.Contains(line, `msg="dependency still failing"`):
			t.Errorf("reminder within OutageReminder: %s", line)
		case strings.Contains(line, `msg="dependency recovered"`):
			recovered++
			if !strings.Contains(line, "level=INFO") {
				t.Errorf("recovery line not at INFO: %s", line)
			}
		}
	}
	if failing != 1 || recovered != 1 {
		t.Fatalf("%s: %d ERROR outage lines and %d recovery lines, want 1 and 1:\n%s", dep, failing, recovered, logs.String())
	}
}

func quoteIfNeeded(s string) string {
	if strings.Contains(s, " ") {
		return `"` + s + `"`
	}
	return s
}

// A broker whose Receive keeps failing is logged once at ERROR, shows in
// Health (not Ready), and its recovery is logged at INFO.
func TestBrokerOutageIsVisible(t *testing.T) {
	e := newMemEnv(t, time.Second)
	var logs logBuffer
	e.broker.Inject(memsource.Fault{Kind: memsource.ReceiveError, Times: -1})
	r, stop := e.run(e.broker.Source(e.topic), e.handler(nil), outageConfig(&logs))
	until(t, "receive failures", func() bool { return r.Health().ReceiveFailures >= 10 })
	if h := r.Health(); h.Ready || !h.Running || !h.LastReceive.IsZero() {
		t.Fatalf("health during the outage %+v: want running, not ready, no receive yet", h)
	}
	e.broker.ClearFaults()
	e.broker.Publish(e.topic, memsource.Outgoing{Key: "k", Body: []byte("x")})
	e.settled()
	until(t, "recovery", func() bool { return r.Health().Ready })
	if h := r.Health(); h.ReceiveFailures != 0 || h.LastReceive.IsZero() {
		t.Fatalf("health after recovery %+v", h)
	}
	stop()
	wantOutageLines(t, &logs, consumer.DependencyBroker, memsource.ErrInjected.Error())
	if h := r.Health(); h.Running || h.Ready {
		t.Fatalf("health after Run returned %+v: want not running, not ready", h)
	}
}

// A store whose claims keep failing is logged once at ERROR with the error,
// shows in Health, and its recovery is logged.
func TestStoreOutageIsVisible(t *testing.T) {
	e := newMemEnv(t, time.Second)
	var logs logBuffer
	e.store.Inject(memdedup.Fault{Kind: memdedup.ClaimError, Times: -1})
	e.broker.Publish(e.topic, memsource.Outgoing{Key: "k", Body: []byte("x")})
	r, stop := e.run(e.broker.Source(e.topic), e.handler(nil), outageConfig(&logs))
	until(t, "store failures", func() bool { return r.Health().StoreFailures >= 5 })
	if h := r.Health(); h.Ready || h.ReceiveFailures != 0 {
		t.Fatalf("health during the store outage %+v: want not ready, the broker fine", h)
	}
	e.store.ClearFaults()
	e.settled()
	until(t, "recovery", func() bool { return r.Health().Ready })
	stop()
	if e.store.Value("effects/k") != 1 || len(e.broker.DeadLetters(e.topic)) != 0 {
		t.Fatalf("effects %d, dead letters %d: want the message applied once", e.store.Value("effects/k"), len(e.broker.DeadLetters(e.topic)))
	}
	wantOutageLines(t, &logs, consumer.DependencyStore, memdedup.ErrInjected.Error())
}

// Failing acknowledgements are an outage of their own.
func TestAckOutageIsVisible(t *testing.T) {
	e := newMemEnv(t, 20*time.Millisecond)
	var logs logBuffer
	e.broker.Inject(memsource.Fault{Kind: memsource.AckError, Times: -1})
	e.broker.Publish(e.topic, memsource.Outgoing{Key: "k", Body: []byte("x")})
	r, stop := e.run(e.broker.Source(e.topic), e.handler(nil), outageConfig(&logs))
	until(t, "ack failures", func() bool { return r.Health().AckFailures >= 3 })
	if h := r.Health(); h.Ready {
		t.Fatalf("health during the ack outage %+v: want not ready", h)
	}
	e.broker.ClearFaults()
	e.settled()
	until(t, "recovery", func() bool { return r.Health().Ready })
	stop()
	wantOutageLines(t, &logs, consumer.DependencyBrokerAck, memsource.ErrInjected.Error())
}

// Failing retries are an outage of the broker's settle route: one ERROR
// line and a recovery line, not a WARN line per message while it lasts, and
// Stats.Retried counts only the retries the source accepted.
func TestSettleOutageIsVisible(t *testing.T) {
	e := newMemEnv(t, 20*time.Millisecond)
	var logs logBuffer
	var failing atomic.Bool
	failing.Store(true)
	e.broker.Inject(memsource.Fault{Kind: memsource.RetryError, Times: -1})
	e.broker.Publish(e.topic, memsource.Outgoing{Key: "k", Body: []byte("x")})
	cfg := outageConfig(&logs)
	cfg.Retry.MaxAttempts = 1000 // retried, never dead-lettered
	r, stop := e.run(e.broker.Source(e.topic), e.handler(func(context.Context, *consumer.Message) error {
		if failing.Load() {
			return errors.New("not yet")
		}
		return nil
	}), cfg)
	const failures = 8 // well past OutageThreshold (3)
	until(t, "retry failures", func() bool { return r.Health().SettleFailures >= failures })
	if st := r.Stats(); st.Retried != 0 || st.SettleFailures < failures {
		t.Fatalf("stats during the outage %+v: want no retry counted, %d settle failures or more", st, failures)
	}
	if n := strings.Count(logs.String(), `msg="retry failed; the broker will redeliver"`); n > 3 {
		t.Fatalf("%d WARN lines about failed retries during the outage, want at most OutageThreshold (3):\n%s", n, logs.String())
	}
	e.broker.ClearFaults()
	until(t, "an accepted retry", func() bool { return r.Stats().Retried >= 1 })
	failing.Store(false)
	e.settled()
	if h := r.Health(); h.SettleFailures != 0 {
		t.Fatalf("health after the recovery %+v: want no settle failures", h)
	}
	stop()
	wantOutageLines(t, &logs, consumer.DependencyBrokerSettle, memsource.ErrInjected.Error())
}

// While the runner drains it is not ready.
func TestHealthWhileDraining(t *testing.T) {
	e := newMemEnv(t, time.Second)
	started, release := make(chan struct{}), make(chan struct{})
	e.broker.Publish(e.topic, memsource.Outgoing{Key: "k", Body: []byte("x")})
	path := e.handler(func(ctx context.Context, msg *consumer.Message) error {
		close(started)
		<-release
		return nil
	})
	r, stop := e.run(e.broker.Source(e.topic), path, consumer.Config{})
	<-started
	if h := r.Health(); !h.Ready || h.Draining {
		t.Fatalf("health while handling %+v: want ready", h)
	}
	go stop()
	until(t, "draining", func() bool { return r.Health().Draining })
	if h := r.Health(); h.Ready || !h.Running {
		t.Fatalf("health while draining %+v: want running, not ready", h)
	}
	close(release)
	until(t, "Run to return", func() bool { return !r.Health().Running })
}

// flakyLeases is a lease driver whose Claim fails while down is set, as
// Redis does during an outage. It reports no capability.
type flakyLeases struct {
	dedupdriver.Lease
	down atomic.Bool
}

func (s *flakyLeases) Driver() dedupdriver.Lease { return s }

func (s *flakyLeases) Caps() dedupdriver.Caps { return dedupdriver.Caps{} }

func (s *flakyLeases) Claim(ctx context.Context, scope string, rec dedup.Record, token string, lease time.Duration) (dedup.Claim, error) {
	if s.down.Load() {
		return dedup.Claim{}, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	return s.Lease.Claim(ctx, scope, rec, token, lease)
}

// A lease store outage (Redis down) is logged once at ERROR naming the store
// and the error, shows in Health, and its recovery is logged; the message is
// applied once afterwards.
func TestLeaseStoreOutageIsVisible(t *testing.T) {
	e := newMemEnv(t, time.Second)
	var logs logBuffer
	leases := &flakyLeases{Lease: e.store.Leases().Driver()}
	leases.down.Store(true)
	var effects atomic.Int64
	path := consumer.Leased(leases, func(ctx context.Context, m *consumer.Message) error {
		effects.Add(1)
		return nil
	}, consumer.LeaseOptions{Lease: time.Second})
	e.broker.Publish(e.topic, memsource.Outgoing{Key: "k", Body: []byte("x")})
	r, stop := e.run(e.broker.Source(e.topic), path, outageConfig(&logs))
	until(t, "store failures", func() bool { return r.Health().StoreFailures >= 3 })
	if h := r.Health(); h.Ready {
		t.Fatalf("health during the lease store outage %+v: want not ready", h)
	}
	leases.down.Store(false)
	e.settled()
	until(t, "recovery", func() bool { return r.Health().Ready })
	stop()
	if n := effects.Load(); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	wantOutageLines(t, &logs, consumer.DependencyStore, "connection refused")
}
