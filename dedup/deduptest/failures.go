package deduptest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// failureRetention is the retention of the counters made for the expiry
// subtest: the shortest every store accepts.
const failureRetention = time.Second

// cleaner is implemented by stores with a janitor (the SQL stores).
type cleaner interface {
	Cleanup(ctx context.Context) (int64, error)
}

// RunFailureCounter runs the conformance suite of failure counting
// (dedupdriver.Caps.FailureCount: RecordFailure and ForgetFailures)
// against the counters newCounter returns. newCounter is called once per
// subtest with the retention the counter must apply to its counts, and must
// return a counter on the real server; it registers the counter's cleanup
// with t.Cleanup. A counter that also has a Cleanup(ctx) (int64, error)
// method (a janitor) is checked to delete expired counts. Subtests run in
// parallel, each on its own scope.
func RunFailureCounter(t *testing.T, newCounter func(t *testing.T, retention time.Duration) dedupdriver.Common) {
	t.Helper()
	tests := []struct {
		name      string
		retention time.Duration
		fn        func(t *testing.T, c dedupdriver.Common)
	}{
		{"CountsEachFailure", time.Hour, failuresCount},
		{"ScopesAndKeysAreSeparate", time.Hour, failuresSeparate},
		{"ConcurrentFailuresGetDistinctCounts", time.Hour, failuresConcurrent},
		{"AnotherPayloadStartsAgain", time.Hour, failuresOtherPayload},
		{"ForgetStartsAgain", time.Hour, failuresForget},
		{"CountExpires", failureRetention, failuresExpire},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newCounter(t, tc.retention))
		})
	}
}

// recordFailure records a failure of key with the payload "p".
func recordFailure(ctx context.Context, t *testing.T, c dedupdriver.Common, scope, key string) int {
	t.Helper()
	return recordFailureOf(ctx, t, c, scope, rec(key, payload("p")))
}

func recordFailureOf(ctx context.Context, t *testing.T, c dedupdriver.Common, scope string, r dedup.Record) int {
	t.Helper()
	n, err := c.RecordFailure(ctx, scope, r)
	if err != nil {
		t.Fatalf("RecordFailure(%q, %q): %v", scope, r.Key, err)
	}
	return n
}

func failuresCount(t *testing.T, c dedupdriver.Common) {
	ctx, scope := testContext(t), newScope(t)
	for want := 1; want <= 3; want++ {
		if got := recordFailure(ctx, t, c, scope, "k"); got != want {
			t.Fatalf("failure %d of one key: count %d", want, got)
		}
	}
}

func failuresSeparate(t *testing.T, c dedupdriver.Common) {
	ctx, scope := testContext(t), newScope(t)
	// Pairs that a naive "scope:key" encoding would merge.
	pairs := [][2]string{
		{scope, "a:b"}, {scope + ":a", "b"}, {scope + "x", "k"}, {scope, "k"},
		{scope, "k}"}, {scope, "k%7D"}, {scope, "ключ ✓"},
	}
	for round := 1; round <= 2; round++ {
		for _, p := range pairs {
			if got := recordFailure(ctx, t, c, p[0], p[1]); got != round {
				t.Fatalf("round %d: RecordFailure(%q, %q) = %d, want %d (counts of different keys must not mix)", round, p[0], p[1], got, round)
			}
		}
	}
}

func failuresConcurrent(t *testing.T, c dedupdriver.Common) {
	ctx, scope := testContext(t), newScope(t)
	const n = 20
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		got  []int
		errs []error
	)
	for range n {
		wg.Go(func() {
			v, err := c.RecordFailure(ctx, scope, rec("hot", payload("p")))
			mu.Lock()
			defer mu.Unlock()
			got, errs = append(got, v), append(errs, err)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("concurrent RecordFailure: %v", err)
		}
	}
	slices.Sort(got)
	for i, v := range got {
		if v != i+1 {
			t.Fatalf("%d concurrent failures returned counts %v, want 1..%d once each", n, got, n)
		}
	}
}

func failuresExpire(t *testing.T, c dedupdriver.Common) {
	ctx, scope := testContext(t), newScope(t)
	recordFailure(ctx, t, c, scope, "old")
	recordFailure(ctx, t, c, scope, "old")
	recordFailure(ctx, t, c, scope, "janitor")
	// Waiting longer than the retention is always safe: the counts are
	// expired afterwards, however slow the machine.
	select {
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	case <-time.After(failureRetention + 500*time.Millisecond):
	}
	if cl, ok := c.(cleaner); ok {
		n, err := cl.Cleanup(ctx)
		if err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		if n < 2 {
			t.Fatalf("Cleanup deleted %d rows, want at least the 2 expired failure counts", n)
		}
	}
	if got := recordFailure(ctx, t, c, scope, "old"); got != 1 {
		t.Fatalf("failure after the count expired: count %d, want 1", got)
	}
	if got := recordFailure(ctx, t, c, scope, "janitor"); got != 1 {
		t.Fatalf("failure after the count expired: count %d, want 1", got)
	}
}

func failuresOtherPayload(t *testing.T, c dedupdriver.Common) {
	ctx, scope := testContext(t), newScope(t)
	recordFailureOf(ctx, t, c, scope, rec("k", payload("first")))
	recordFailureOf(ctx, t, c, scope, rec("k", payload("first")))
	if got := recordFailureOf(ctx, t, c, scope, rec("k", payload("second"))); got != 1 {
		t.Fatalf("first failure with another payload under the same key: count %d, want 1", got)
	}
	if got := recordFailureOf(ctx, t, c, scope, rec("k", payload("second"))); got != 2 {
		t.Fatalf("second failure with that payload: count %d, want 2", got)
	}
}

func failuresForget(t *testing.T, c dedupdriver.Common) {
	ctx, scope := testContext(t), newScope(t)
	if err := c.ForgetFailures(ctx, scope, "never-failed"); err != nil {
		t.Fatalf("ForgetFailures of a key without a count: %v", err)
	}
	recordFailure(ctx, t, c, scope, "k")
	recordFailure(ctx, t, c, scope, "k")
	recordFailure(ctx, t, c, scope, "other")
	if err := c.ForgetFailures(ctx, scope, "k"); err != nil {
		t.Fatalf("ForgetFailures: %v", err)
	}
	if got := recordFailure(ctx, t, c, scope, "k"); got != 1 {
		t.Fatalf("failure after ForgetFailures: count %d, want 1", got)
	}
	if got := recordFailure(ctx, t, c, scope, "other"); got != 2 {
		t.Fatalf("ForgetFailures of one key changed another: count %d, want 2", got)
	}
}
