package sqssource

import (
	"slices"
	"testing"
	"time"
)

// due picks the in-flight messages whose visibility timeout started at least
// half a heartbeat interval ago, skips those no longer extended, and gives
// up on those in flight for MaxExtension.
func TestHeartbeatDue(t *testing.T) {
	const interval = 10 * time.Second
	s := orderSource(false, false)
	s.closeCtx = t.Context()
	s.cfg.HeartbeatInterval = interval
	s.cfg.MaxExtension = time.Hour
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	track := func(id string, received, extended time.Duration, done bool) *handle {
		h := &handle{src: s, id: id, receivedAt: now.Add(-received), extendedAt: now.Add(-extended), done: done}
		s.inflight[h] = struct{}{}
		return h
	}
	track("fresh", 4*time.Second, 4*time.Second, false)               // extended less than interval/2 ago
	track("half", 5*time.Second, interval/2, false)                   // exactly interval/2: due
	track("extended-long-ago", 30*time.Minute, 20*time.Second, false) // due
	track("done", 30*time.Minute, 20*time.Second, true)               // invalid handle or past MaxExtension
	old := track("old", time.Hour, 20*time.Second, false)             // reached MaxExtension

	var got []string
	for _, h := range s.due(now) {
		got = append(got, h.id)
	}
	slices.Sort(got)
	wantIDs(t, "due", got, "extended-long-ago", "half")
	if !old.done {
		t.Error("a message in flight for MaxExtension is still extended")
	}
	if n := s.Stats().Expired; n != 1 {
		t.Errorf("Stats().Expired = %d, want 1", n)
	}

	// The next tick neither extends it nor counts it again.
	got = got[:0]
	for _, h := range s.due(now.Add(interval)) {
		got = append(got, h.id)
	}
	slices.Sort(got)
	wantIDs(t, "due a tick later", got, "extended-long-ago", "fresh", "half")
	if n := s.Stats().Expired; n != 1 {
		t.Errorf("Stats().Expired a tick later = %d, want 1", n)
	}
}

// seconds rounds a visibility timeout up to whole seconds within SQS's
// range, so a retry is never made visible early.
func TestSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int32
	}{
		{-time.Second, 0},
		{0, 0},
		{time.Nanosecond, 1},
		{time.Second, 1},
		{1500 * time.Millisecond, 2},
		{MaxVisibility, 43200},
		{MaxVisibility + time.Hour, 43200},
	} {
		if got := seconds(tc.d); got != tc.want {
			t.Errorf("seconds(%s) = %d, want %d", tc.d, got, tc.want)
		}
	}
}
