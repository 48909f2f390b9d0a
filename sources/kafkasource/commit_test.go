package kafkasource_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
)

// never is a CommitInterval no test outlives: only a rebalance or Close
// commits.
const never = time.Hour

func TestAckCommitsWithinInterval(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, outgoing("i", 5)...)

	src := openSource(t, testConfig(t, brokers, topic, group))
	msgs := receiveN(t, src, 5, waitTimeout)
	if err := src.Ack(context.Background(), msgs); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	waitOffset(t, brokers, group, topic, 5)
	if s := src.Stats(); s.Commits == 0 {
		t.Fatalf("Stats.Commits = 0 after the offsets were committed")
	}
}

func TestAckDefersAndCoalescesCommitsUntilClose(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	const n = 20
	publish(t, brokers, topic, outgoing("c", n)...)

	cfg := testConfig(t, brokers, topic, group)
	cfg.CommitInterval = never
	src := openSource(t, cfg)
	for _, m := range sortByOffset(receiveN(t, src, n, waitTimeout)) {
		if err := src.Ack(context.Background(), []*consumer.Message{m}); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	afterCommitTicks()
	if got := committedOffsets(t, brokers, group, topic, 1)[0]; got != -1 {
		t.Fatalf("committed offset %d before CommitInterval passed; want Ack to leave the commit to the background loop", got)
	}
	if s := src.Stats(); s.Commits != 0 {
		t.Fatalf("Stats.Commits = %d before CommitInterval passed, want 0", s.Commits)
	}
	if err := src.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := committedOffsets(t, brokers, group, topic, 1)[0]; got != n {
		t.Fatalf("committed offset %d after Close, want %d", got, n)
	}
	if s := src.Stats(); s.Commits != 1 || s.CommitFailures != 0 {
		t.Fatalf("Stats.Commits = %d, CommitFailures = %d for %d Acks and Close; want one coalesced commit", s.Commits, s.CommitFailures, n)
	}
}

func TestRebalanceFlushesSettledPrefix(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, outgoing("r", 5)...)

	cfg := testConfig(t, brokers, topic, group)
	cfg.CommitInterval = never
	a := openSource(t, cfg)
	msgs := sortByOffset(receiveN(t, a, 5, waitTimeout))
	// Offsets 0-2 settled, 3 unsettled, 4 settled behind it.
	if err := a.Ack(context.Background(), []*consumer.Message{msgs[0], msgs[1], msgs[2], msgs[4]}); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	afterCommitTicks()
	if got := committedOffsets(t, brokers, group, topic, 1)[0]; got != -1 {
		t.Fatalf("committed offset %d before the rebalance, want nothing committed yet", got)
	}

	// A second member joins: the group rebalances, and the first member's
	// generation ends with a commit of its settled prefix, while it stays
	// open.
	_ = openSource(t, cfg)
	waitOffset(t, brokers, group, topic, 3)
	if s := a.Stats(); s.Commits != 1 {
		t.Fatalf("first member: Stats.Commits = %d after the rebalance, want 1", s.Commits)
	}
}
