package amqpsource_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/amqpsource"
)

// A settled delivery behind one that stays unsettled is acknowledged on its
// own, so it does not keep its prefetch slot; the unsettled one is not
// covered.
func TestSettledBehindUnsettledIsAcked(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	out := outgoing("behind", 3)
	publish(t, url, q, out...)

	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 3})
	msgs := receive(t, src, 3, testTimeout)
	if err := src.Ack(context.Background(), msgs[1:]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	deadline := time.Now().Add(testTimeout)
	for src.Stats().Acked != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("Stats().Acked = %d while the oldest delivery stays unsettled, want 2", src.Stats().Acked)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	next := newSource(t, amqpsource.Config{URL: url, Queue: q})
	back := receive(t, next, 1, testTimeout)
	if got, want := sortedKeys(back), []string{msgs[0].Key}; !slices.Equal(got, want) {
		t.Fatalf("queue holds %v, want the unsettled %v", got, want)
	}
	if err := next.Ack(context.Background(), back); err != nil {
		t.Fatal(err)
	}
	runtest.ExpectNothing(t, next, 300*time.Millisecond)
}
