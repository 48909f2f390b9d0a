package kafkasource_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// TestDeadLetterFailureBoundsUncommitted checks that a message whose
// dead-letter write keeps failing does not make the source retain every later
// message of its partition: fetching stops at MaxUncommitted, and the stuck
// message is counted.
func TestDeadLetterFailureBoundsUncommitted(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, outgoing("d", 10)...)
	cfg := testConfig(t, brokers, topic, group)
	cfg.DeadLetterTopic = "invalid topic name!" // the broker refuses it
	cfg.DeadLetterTimeout = 3 * time.Second
	cfg.DeadLetterRetryDelay = 50 * time.Millisecond
	cfg.MaxInFlight = 2
	cfg.MaxUncommitted = 4
	src := openSource(t, cfg)
	ctx := context.Background()

	var poison string
	failures := 0
	deadline := time.Now().Add(waitTimeout)
	for failures < kafkasource.DeadLetterStuckAfter && time.Now().Before(deadline) {
		for _, m := range receiveN(t, src, 1, waitTimeout) {
			if poison == "" {
				poison = m.ID
			}
			if m.ID != poison {
				if err := src.Ack(ctx, []*consumer.Message{m}); err != nil {
					t.Fatalf("Ack: %v", err)
				}
				continue
			}
			if err := src.DeadLetter(ctx, m, errors.New("poison")); err == nil {
				t.Fatalf("DeadLetter to an invalid topic succeeded")
			}
			failures++
		}
	}
	time.Sleep(time.Second) // time for the fetcher to overrun the bound
	s := src.Stats()
	if s.Received != 4 || s.Uncommitted != 4 {
		t.Fatalf("Stats.Received = %d, Uncommitted = %d behind a stuck dead-letter write, want 4 and 4 (MaxUncommitted)", s.Received, s.Uncommitted)
	}
	if s.DeadLetterStuck != 1 || s.DeadLetterFailures != uint64(failures) {
		t.Fatalf("Stats.DeadLetterStuck = %d, DeadLetterFailures = %d, want 1 and %d", s.DeadLetterStuck, s.DeadLetterFailures, failures)
	}
	if got := committedOffsets(t, brokers, group, topic, 1)[0]; got != -1 {
		t.Fatalf("committed offset %d past the message whose dead-letter write failed", got)
	}
}

// TestDeadLetterTruncatesLongReason checks that a reason too long for a
// record is cut, so that the dead-letter write succeeds.
func TestDeadLetterTruncatesLongReason(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, outgoing("r", 1)...)
	src := openSource(t, testConfig(t, brokers, topic, group))
	m := receiveN(t, src, 1, waitTimeout)[0]
	reason := errors.New(strings.Repeat("é", 1<<20)) // 2 MiB
	if err := src.DeadLetter(context.Background(), m, reason); err != nil {
		t.Fatalf("DeadLetter with a 2 MiB reason: %v", err)
	}
	dead := readTopic(t, brokers, kafkasource.DeadLetterTopic(topic))
	if len(dead) != 1 {
		t.Fatalf("dead-letter topic holds %d messages, want 1", len(dead))
	}
	got := header(dead[0], consumer.MetaReason)
	if len(got) > kafkasource.MaxReasonBytes || !strings.HasPrefix(got, "éé") || !strings.HasSuffix(got, "(truncated)") {
		t.Fatalf("reason header of %d bytes (%.20q...), want at most %d ending with (truncated)", len(got), got, kafkasource.MaxReasonBytes)
	}
}

// TestHeldMessagesDoNotStopOtherPartitions checks that with OrderByPartition
// the messages held behind a retried one do not use up MaxInFlight and stop
// the fetching of the other partitions.
func TestHeldMessagesDoNotStopOtherPartitions(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 2)
	cfg := testConfig(t, brokers, topic, runtest.UniqueName(t, "g"))
	cfg.Ordering = kafkasource.OrderByPartition
	cfg.MaxInFlight = 2
	src := openSource(t, cfg)
	ctx := context.Background()

	// One Kafka key for each partition.
	keys := map[int]string{}
	for i := 0; len(keys) < 2; i++ {
		k := "k" + strconv.Itoa(i)
		p := (&kafka.Hash{}).Balance(kafka.Message{Key: []byte(k)}, 0, 1)
		if _, ok := keys[p]; !ok {
			keys[p] = k
		}
	}
	msg := func(p int, body string) sourcetest.Outgoing {
		return sourcetest.Outgoing{Key: body, Body: []byte(body), PartitionKey: keys[p]}
	}

	publish(t, brokers, topic, msg(0, "a0"))
	first := receiveN(t, src, 1, waitTimeout)[0]
	if err := src.Retry(ctx, first, time.Minute); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	publish(t, brokers, topic, msg(0, "a1"), msg(0, "a2"), msg(0, "a3"), msg(0, "a4"))
	for deadline := time.Now().Add(waitTimeout); src.Stats().Held < 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no message of partition 0 held behind the retried one")
		}
	}
	publish(t, brokers, topic, msg(1, "b0"))
	if m := receiveN(t, src, 1, 15*time.Second)[0]; m.Key != "b0" {
		t.Fatalf("received %q, want b0 of the other partition", m.Key)
	}
	if held := src.Stats().Held; held != 4 {
		t.Fatalf("Stats.Held = %d, want 4", held)
	}
}

// TestRetriesOfKeyComeBackInOrder checks that messages of one key retried
// with the same delay are handed out again in offset order.
func TestRetriesOfKeyComeBackInOrder(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	src := openSource(t, testConfig(t, brokers, topic, runtest.UniqueName(t, "g")))
	ctx := context.Background()

	const n = 50
	out := outgoing("o", n)
	for i := range out {
		out[i].PartitionKey = "acct"
	}
	publish(t, brokers, topic, out...)
	got := sortByOffset(receiveN(t, src, n, waitTimeout))
	for round := 1; round <= 5; round++ {
		for _, m := range got {
			if err := src.Retry(ctx, m, 50*time.Millisecond); err != nil {
				t.Fatalf("Retry: %v", err)
			}
		}
		got = receiveN(t, src, n, waitTimeout)
		for i := 1; i < n; i++ {
			a, b := got[i-1].Raw.(kafka.Message), got[i].Raw.(kafka.Message)
			if a.Offset > b.Offset {
				t.Fatalf("round %d: retried offset %d handed out before offset %d of the same key", round, a.Offset, b.Offset)
			}
		}
	}
}

// TestConcurrentAcksCommitEverything checks that Acks from many goroutines,
// which share commits, leave every settled offset committed.
func TestConcurrentAcksCommitEverything(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 2)
	group := runtest.UniqueName(t, "g")
	const n = 200
	publish(t, brokers, topic, outgoing("c", n)...)
	src := openSource(t, testConfig(t, brokers, topic, group))
	msgs := receiveN(t, src, n, waitTimeout)
	want := map[int]int64{}
	for _, m := range msgs {
		km := m.Raw.(kafka.Message)
		want[km.Partition] = max(want[km.Partition], km.Offset+1)
	}

	var wg sync.WaitGroup
	for _, m := range msgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := src.Ack(ctx, []*consumer.Message{m}); err != nil {
				t.Errorf("Ack %s: %v", m.ID, err)
			}
		}()
	}
	wg.Wait()
	if err := src.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	got := committedOffsets(t, brokers, group, topic, 2)
	for p, off := range want {
		if got[p] != off {
			t.Errorf("partition %d: committed %d after every Ack returned and Close, want %d", p, got[p], off)
		}
	}
}
