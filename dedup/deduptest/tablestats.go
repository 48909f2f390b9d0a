package deduptest

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

// Janitor is a store whose janitor measures its table: pgdedup and
// sqldedup.
type Janitor interface {
	dedup.TableStatsReporter
	RunJanitor(ctx context.Context) error
}

// CheckJanitorStats runs store's janitor until it reports a measurement made
// after before, stops it, and checks the measurement of the table a store's
// test has set up by then: records a1, a2 and a3 committed in scope "a",
// a2's processing time set to oldest, and records b1 and b2 in scope "b",
// b2 expired (so the janitor's cleanup deletes it before it measures).
func CheckJanitorStats(t *testing.T, ctx context.Context, store Janitor, before, oldest time.Time) {
	t.Helper()
	jctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- store.RunJanitor(jctx) }()
	var st dedup.TableStats
	for {
		var ok bool
		if st, ok = store.TableStats(); ok && !st.At.Before(before) {
			break
		}
		select {
		case <-ctx.Done():
			stop()
			t.Fatal("the janitor reported no measurement in time")
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(st.Scopes) != 2 || st.Scopes[0].Scope != "a" || st.Scopes[1].Scope != "b" {
		t.Fatalf("scopes %+v, want a and b", st.Scopes)
	}
	if a := st.Scopes[0]; a.Records != 3 || !a.Oldest.Equal(oldest) {
		t.Errorf("scope a: %d records, oldest %v; want 3, %v", a.Records, a.Oldest, oldest)
	}
	if b := st.Scopes[1]; b.Records != 1 {
		t.Errorf("scope b: %d records, want 1 (the expired one deleted first)", b.Records)
	}
	if st.Records() != 4 {
		t.Errorf("Records() = %d, want 4", st.Records())
	}
}
