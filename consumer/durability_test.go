package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/internal/runtest"
)

// durableLeases is a lease store whose driver reports Durability and
// answers it with d and err.
type durableLeases struct {
	dedupdriver.Lease
	d     dedup.Durability
	err   error
	calls int
}

func (s *durableLeases) Driver() dedupdriver.Lease { return s }

func (s *durableLeases) Caps() dedupdriver.Caps {
	c := s.Lease.Caps()
	c.Durability = true
	return c
}

func (s *durableLeases) Durability(context.Context) (dedup.Durability, error) {
	s.calls++
	return s.d, s.err
}

// Run asks a store that reports its durability once, at start: a loss is one
// WARN line and Health.StoreLoss, a refusal (dedup.ErrNotDurable) stops Run
// before it receives anything, an unreadable answer is one WARN and no
// loss, and none says nothing.
func TestRunChecksTheStoresDurability(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		d      dedup.Durability
		err    error
		warn   string // in the WARN line; "" for none
		loss   string // Health.StoreLoss
		refuse bool
	}{
		{"durable", dedup.Durability{Settings: "fsync=always"}, nil, "", "", false},
		{"lossy", dedup.Durability{Settings: "fsync=never", Loss: "a crash loses it"}, nil, "a crash loses it", "a crash loses it", false},
		{"unreadable", dedup.Durability{}, errors.New("CONFIG refused"), "CONFIG refused", "", false},
		{"refused", dedup.Durability{Loss: "a crash loses it"}, errors.Join(dedup.ErrNotDurable, errors.New("required")), "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ms := memStore(t)
			store := &durableLeases{Lease: ms.Leases().Driver(), d: tc.d, err: tc.err}
			b := memBroker(t, memsource.Config{})
			var logs runtest.SyncBuffer
			r := newRunner(t, b.Source("in"), consumer.Leased(store, func(context.Context, *consumer.Message) error { return nil }, consumer.LeaseOptions{}),
				consumer.Config{Name: "durability", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			b.Publish("in", memsource.Outgoing{Key: "k"})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			var runErr error
			if tc.refuse {
				select {
				case runErr = <-done:
				case <-time.After(10 * time.Second):
					cancel()
					runErr = <-done
					t.Errorf("Run ran on for 10 s; want the refusal at start")
				}
			} else {
				runtest.WaitFor(t, 10*time.Second, runtest.Say("the message handled"), func() bool { return r.Stats().Handled >= 1 })
				if got := r.Health().StoreLoss; got != tc.loss {
					t.Errorf("Health().StoreLoss = %q, want %q", got, tc.loss)
				}
				cancel()
				runErr = <-done
			}
			cancel()
			if tc.refuse != errors.Is(runErr, dedup.ErrNotDurable) || !tc.refuse && runErr != nil {
				t.Fatalf("Run = %v, want a refusal: %v", runErr, tc.refuse)
			}
			if tc.refuse && r.Stats().Received != 0 {
				t.Errorf("%d messages received before the refusal", r.Stats().Received)
			}
			if store.calls != 1 {
				t.Errorf("Durability called %d times, want once", store.calls)
			}
			var warns []string
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, "level=WARN") {
					warns = append(warns, l)
				}
			}
			switch {
			case tc.warn == "" && len(warns) != 0:
				t.Errorf("WARN lines %q, want none", warns)
			case tc.warn != "" && (len(warns) != 1 || !strings.Contains(warns[0], tc.warn)):
				t.Errorf("WARN lines %q, want one naming %q", warns, tc.warn)
			}
		})
	}
}
