package amqpsource_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/amqpsource"
)

// Acknowledgements of separate Ack calls that complete a contiguous run
// share one multiple-ack frame.
func TestAcksOfSeveralCallsShareFrames(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	const n = 10
	publish(t, url, q, outgoing("frames", n)...)

	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: 20})
	msgs := receive(t, src, n, testTimeout) // in delivery-tag order
	// Newest first: every call but the last settles a delivery behind the
	// unsettled oldest one, which the last call settles.
	for i := n - 1; i >= 0; i-- {
		if err := src.Ack(context.Background(), []*consumer.Message{msgs[i]}); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	st := src.Stats()
	if st.Acked != n {
		t.Fatalf("Stats().Acked = %d, want %d", st.Acked, n)
	}
	if st.AckFrames >= n {
		t.Errorf("Stats().AckFrames = %d for %d acknowledgements, want them to share frames", st.AckFrames, n)
	}
	next := newSource(t, amqpsource.Config{URL: url, Queue: q})
	expectNothing(t, next, 500*time.Millisecond)
}

// A settled delivery behind one that stays unsettled is acknowledged on its
// own after a short hold, so it does not keep its prefetch slot; the
// unsettled one is not covered.
func TestSettledBehindUnsettledIsAckedAfterHold(t *testing.T) {
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
	expectNothing(t, next, 300*time.Millisecond)
}
