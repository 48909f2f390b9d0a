package kafkasource_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

func TestNewRejectsInvalidConfig(t *testing.T) {
	valid := kafkasource.Config{Brokers: []string{"127.0.0.1:9092"}, Topics: []string{"t"}, GroupID: "g"}
	cases := []struct {
		field string
		edit  func(*kafkasource.Config)
	}{
		{"Brokers", func(c *kafkasource.Config) { c.Brokers = nil }},
		{"Brokers", func(c *kafkasource.Config) { c.Brokers = []string{" "} }},
		{"Topics", func(c *kafkasource.Config) { c.Topics = nil }},
		{"Topics", func(c *kafkasource.Config) { c.Topics = []string{"a", "a"} }},
		{"Topics", func(c *kafkasource.Config) { c.Topics = []string{""} }},
		{"GroupID", func(c *kafkasource.Config) { c.GroupID = "" }},
		{"StartOffset", func(c *kafkasource.Config) { c.StartOffset = 42 }},
		{"Ordering", func(c *kafkasource.Config) { c.Ordering = 7 }},
		{"MaxInFlight", func(c *kafkasource.Config) { c.MaxInFlight = -1 }},
		{"MaxUncommitted", func(c *kafkasource.Config) { c.MaxInFlight, c.MaxUncommitted = 10, 5 }},
		{"MaxBytes", func(c *kafkasource.Config) { c.MinBytes, c.MaxBytes = 10, 5 }},
		{"HeartbeatInterval", func(c *kafkasource.Config) { c.SessionTimeout, c.HeartbeatInterval = time.Second, 2*time.Second }},
		{"DeadLetterTopic", func(c *kafkasource.Config) { c.DeadLetterTopic = "t" }},
		{"CommitTimeout", func(c *kafkasource.Config) { c.CommitTimeout = -time.Second }},
	}
	for _, tc := range cases {
		cfg := valid
		tc.edit(&cfg)
		src, err := kafkasource.New(t.Context(), cfg)
		if err == nil {
			_ = src.Close()
			t.Errorf("%s: New accepted an invalid configuration", tc.field)
			continue
		}
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != "kafkasource.Config."+tc.field || !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("%s: New returned %v, want a *idemq.ConfigError for field %s matching idemq.ErrInvalidConfig", tc.field, err, tc.field)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	c := kafkasource.Config{}.WithDefaults()
	if c.Dialer != kafka.DefaultDialer || c.StartOffset != kafka.FirstOffset || c.KeyHeader != kafkasource.DefaultKeyHeader ||
		c.MaxInFlight != 1000 || c.SessionTimeout != 10*time.Second ||
		c.CommitTimeout != 10*time.Second || c.Logger == nil || c.Ordering != kafkasource.OrderByKey {
		t.Fatalf("WithDefaults left a zero field: %+v", c)
	}
}

func TestReceiveFillsMessage(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, testPartitions)
	publish(t, brokers, topic, sourcetest.Outgoing{
		Key: "order-1", Body: []byte(`{"n":1}`), PartitionKey: "account-7",
		Headers: map[string]string{"trace": "abc"},
	})
	src := openSource(t, testConfig(t, brokers, topic, runtest.UniqueName(t, "g")))
	m := receiveN(t, src, 1, waitTimeout)[0]

	km, ok := m.Raw.(kafka.Message)
	if !ok {
		t.Fatalf("Raw is %T, want kafka.Message", m.Raw)
	}
	wantID := fmt.Sprintf("%s/%d/%d", topic, km.Partition, km.Offset)
	switch {
	case m.ID != wantID:
		t.Errorf("ID = %q, want %q", m.ID, wantID)
	case m.Key != "order-1":
		t.Errorf("Key = %q, want the key header", m.Key)
	case m.PartitionKey != "account-7":
		t.Errorf("PartitionKey = %q, want the Kafka message key", m.PartitionKey)
	case m.Topic != topic || m.Attempt != 1 || m.Redelivered || m.ReceivedAt.IsZero():
		t.Errorf("Topic/Attempt/Redelivered/ReceivedAt = %q/%d/%v/%v", m.Topic, m.Attempt, m.Redelivered, m.ReceivedAt)
	case string(m.Body) != `{"n":1}` || m.Headers["trace"] != "abc" || m.Headers[kafkasource.DefaultKeyHeader] != "order-1":
		t.Errorf("Body/Headers = %q/%v", m.Body, m.Headers)
	}
	if err := src.Ack(context.Background(), []*consumer.Message{m}); err != nil {
		t.Fatalf("Ack: %v", err)
	}
}

func TestKeyFuncAndOrderByPartition(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	publish(t, brokers, topic, sourcetest.Outgoing{Body: []byte("b"), PartitionKey: "k"})
	cfg := testConfig(t, brokers, topic, runtest.UniqueName(t, "g"))
	cfg.KeyFunc = func(m kafka.Message) string { return "from-func-" + string(m.Value) }
	cfg.Ordering = kafkasource.OrderByPartition
	m := receiveN(t, openSource(t, cfg), 1, waitTimeout)[0]
	if m.Key != "from-func-b" || m.PartitionKey != topic+"/0" {
		t.Fatalf("Key/PartitionKey = %q/%q, want from-func-b/%s/0", m.Key, m.PartitionKey, topic)
	}
}

// TestCommitsOnlySettledPrefix checks that an acknowledged message is not
// committed while an earlier message of its partition is unsettled, and that
// the unsettled one and everything after it come back to a new member.
func TestCommitsOnlySettledPrefix(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, outgoing("a", 10)...)

	src := openSource(t, testConfig(t, brokers, topic, group))
	msgs := sortByOffset(receiveN(t, src, 10, waitTimeout))
	ctx := context.Background()
	if err := src.Ack(ctx, msgs[1:]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	afterCommitTicks()
	if got := committedOffsets(t, brokers, group, topic, 1)[0]; got != -1 {
		t.Fatalf("committed offset %d after acknowledging offsets 1-9 but not 0; want nothing committed", got)
	}
	if err := src.Ack(ctx, msgs[:1]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	waitOffset(t, brokers, group, topic, 10)

	// Offsets 10-14: leave 10 unsettled, acknowledge the rest, close.
	publish(t, brokers, topic, outgoing("b", 5)...)
	more := sortByOffset(receiveN(t, src, 5, waitTimeout))
	if err := src.Ack(ctx, more[1:]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if err := src.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := committedOffsets(t, brokers, group, topic, 1)[0]; got != 10 {
		t.Fatalf("committed offset %d with offset 10 unsettled, want 10", got)
	}

	again := sortByOffset(receiveN(t, openSource(t, testConfig(t, brokers, topic, group)), 5, waitTimeout))
	for i, m := range again {
		if want := more[i].ID; m.ID != want {
			t.Fatalf("redelivery %d is %s, want %s (everything from the unsettled offset on)", i, m.ID, want)
		}
	}
}

func TestRetryRedeliversInProcess(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, outgoing("r", 2)...)
	src := openSource(t, testConfig(t, brokers, topic, group))
	msgs := sortByOffset(receiveN(t, src, 2, waitTimeout))
	ctx := context.Background()

	if err := src.Retry(ctx, msgs[0], 100*time.Millisecond); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	if err := src.Ack(ctx, msgs[1:]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	afterCommitTicks()
	if got := committedOffsets(t, brokers, group, topic, 1)[0]; got != -1 {
		t.Fatalf("committed offset %d while offset 0 waits for a retry; want nothing committed", got)
	}
	r := receiveN(t, src, 1, waitTimeout)[0]
	if r.ID != msgs[0].ID || r.Key != msgs[0].Key || r.Attempt != 2 || !r.Redelivered {
		t.Fatalf("retry delivered %s key %q attempt %d redelivered %v; want %s key %q attempt 2 redelivered",
			r.ID, r.Key, r.Attempt, r.Redelivered, msgs[0].ID, msgs[0].Key)
	}
	if err := src.Ack(ctx, []*consumer.Message{r}); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	waitOffset(t, brokers, group, topic, 2)
	if err := src.Retry(ctx, r, 0); !errors.Is(err, kafkasource.ErrSettled) {
		t.Fatalf("Retry of an acknowledged message: %v, want ErrSettled", err)
	}
	other := openSource(t, testConfig(t, brokers, topic, runtest.UniqueName(t, "other")))
	if err := other.Ack(ctx, []*consumer.Message{r}); !errors.Is(err, kafkasource.ErrForeignMessage) {
		t.Fatalf("Ack of another source's message: %v, want ErrForeignMessage", err)
	}
}

// TestReleaseKeepsAttempt checks that Release redelivers in process without
// counting an attempt.
func TestReleaseKeepsAttempt(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	publish(t, brokers, topic, outgoing("rel", 1)...)
	src := openSource(t, testConfig(t, brokers, topic, runtest.UniqueName(t, "g")))
	m := receiveN(t, src, 1, waitTimeout)[0]
	if err := src.Release(context.Background(), m, 10*time.Millisecond, errors.New("store down")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	r := receiveN(t, src, 1, waitTimeout)[0]
	if r.ID != m.ID || r.Attempt != m.Attempt {
		t.Fatalf("released message came back as %s attempt %d; want %s attempt %d", r.ID, r.Attempt, m.ID, m.Attempt)
	}
	if err := src.Ack(context.Background(), []*consumer.Message{r}); err != nil {
		t.Fatalf("Ack: %v", err)
	}
}

// TestRetryHoldsLaterMessagesOfKey checks that while a message waits for a
// retry, later messages of its key are held back, and other keys are not.
func TestRetryHoldsLaterMessagesOfKey(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	src := openSource(t, testConfig(t, brokers, topic, runtest.UniqueName(t, "g")))
	ctx := context.Background()

	publish(t, brokers, topic, sourcetest.Outgoing{Key: "k1", Body: []byte("1"), PartitionKey: "acct"})
	first := receiveN(t, src, 1, waitTimeout)[0]
	if err := src.Retry(ctx, first, 200*time.Millisecond); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	publish(t, brokers, topic,
		sourcetest.Outgoing{Key: "k2", Body: []byte("2"), PartitionKey: "acct"},
		sourcetest.Outgoing{Key: "o1", Body: []byte("3"), PartitionKey: "other"},
	)
	got := receiveN(t, src, 2, waitTimeout)
	keys := []string{got[0].Key, got[1].Key}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"k1", "o1"}) {
		t.Fatalf("received %v while k1 waits for its retry; want k1 (retried) and o1, with k2 held", keys)
	}
	if held := src.Stats().Held; held != 1 {
		t.Fatalf("Stats.Held = %d, want 1 (k2)", held)
	}
	runtest.ExpectNothing(t, src, time.Second)

	retried := got[0]
	if retried.Key != "k1" {
		retried = got[1]
	}
	if err := src.Ack(ctx, []*consumer.Message{retried}); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if m := receiveN(t, src, 1, waitTimeout)[0]; m.Key != "k2" {
		t.Fatalf("after k1 was acknowledged, received %q, want k2", m.Key)
	}
}

func TestDeadLetterWritesCopyAndCommits(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, sourcetest.Outgoing{
		Key: "bad-1", Body: []byte("poison"), PartitionKey: "acct", Headers: map[string]string{"trace": "t1"},
	})
	src := openSource(t, testConfig(t, brokers, topic, group))
	m := receiveN(t, src, 1, waitTimeout)[0]
	reason := &consumer.DeadLetterError{Key: "bad-1", Attempts: 3, Err: fmt.Errorf("%w after 3 attempts: boom", consumer.ErrMaxAttempts)}
	if err := src.DeadLetter(context.Background(), m, reason); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	waitOffset(t, brokers, group, topic, 1)
	dead := readTopic(t, brokers, kafkasource.DeadLetterTopic(topic))
	if len(dead) != 1 {
		t.Fatalf("dead-letter topic holds %d messages, want 1", len(dead))
	}
	d := dead[0]
	want := map[string]string{
		consumer.MetaReason:             reason.Error(),
		consumer.MetaAttempts:           "3",
		kafkasource.MetaOriginTopic:     topic,
		kafkasource.MetaOriginPartition: "0",
		kafkasource.MetaOriginOffset:    "0",
		kafkasource.MetaGroup:           group,
		consumer.MetaKey:                "bad-1",
		kafkasource.DefaultKeyHeader:    "bad-1",
		"trace":                         "t1",
	}
	for k, v := range want {
		if got := header(d, k); got != v {
			t.Errorf("dead letter header %s = %q, want %q", k, got, v)
		}
	}
	if string(d.Value) != "poison" || string(d.Key) != "acct" || header(d, consumer.MetaDeadLetteredAt) == "" {
		t.Errorf("dead letter value/key/time = %q/%q/%q", d.Value, d.Key, header(d, consumer.MetaDeadLetteredAt))
	}
}

// TestDeadLetterFailureKeepsMessage checks that a failed dead-letter write
// commits nothing and hands the message out again.
func TestDeadLetterFailureKeepsMessage(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, outgoing("d", 1)...)
	cfg := testConfig(t, brokers, topic, group)
	cfg.DeadLetterTopic = "invalid topic name!" // the broker refuses it
	cfg.DeadLetterTimeout = 3 * time.Second
	src := openSource(t, cfg)
	m := receiveN(t, src, 1, waitTimeout)[0]
	if err := src.DeadLetter(context.Background(), m, errors.New("poison")); err == nil {
		t.Fatalf("DeadLetter to an invalid topic succeeded")
	}
	afterCommitTicks()
	if got := committedOffsets(t, brokers, group, topic, 1)[0]; got != -1 {
		t.Fatalf("committed offset %d after a failed dead-letter write, want nothing committed", got)
	}
	again := receiveN(t, src, 1, waitTimeout)[0]
	if again.ID != m.ID || again.Attempt != m.Attempt {
		t.Fatalf("handed out %s attempt %d after the failed write, want %s attempt %d", again.ID, again.Attempt, m.ID, m.Attempt)
	}
	if s := src.Stats(); s.DeadLetterFailures != 1 || s.DeadLettered != 0 {
		t.Fatalf("Stats = %+v, want one dead-letter failure", s)
	}
}

// TestStaleMessagesAreNotCommitted checks the rebalance fence: messages
// fetched before a rebalance and acknowledged after it commit nothing.
func TestStaleMessagesAreNotCommitted(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, outgoing("s", 3)...)

	logs := testenv.NewLogRecorder()
	acfg := testConfig(t, brokers, topic, group)
	acfg.Logger = logs.Logger()
	a := openSource(t, acfg)
	stale := receiveN(t, a, 3, waitTimeout)
	gen := a.Stats().Rebalances

	b := openSource(t, testConfig(t, brokers, topic, group)) // joins: the group rebalances
	deadline := time.Now().Add(waitTimeout)
	for a.Stats().Rebalances <= gen {
		if time.Now().After(deadline) {
			t.Fatalf("the first member did not rejoin the group within %s", waitTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := a.Ack(testenv.MarkedContext(context.Background(), "ack"), stale); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	afterCommitTicks()
	if got := committedOffsets(t, brokers, group, topic, 1)[0]; got != -1 {
		t.Fatalf("stale acknowledgements committed offset %d; want nothing committed", got)
	}
	if s := a.Stats(); s.StaleCommitsSkipped == 0 {
		t.Fatalf("Stats.StaleCommitsSkipped = 0 after acknowledging stale messages")
	}
	// The skip is logged with the Ack's context, for trace-aware handlers.
	skipped := logs.Find("commit skipped")
	if len(skipped) == 0 {
		t.Fatalf("no \"commit skipped\" line logged")
	}
	for _, l := range skipped {
		if l.Mark != "ack" {
			t.Errorf("%q logged without the Ack call's context", l.Message)
		}
	}

	// The partition's owner in the new generation receives them again and
	// commits them.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	redelivered := 0
	for redelivered < 3 {
		for _, src := range []*kafkasource.Source{a, b} {
			rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			msgs, err := src.Receive(rctx, 10)
			rcancel()
			if err != nil {
				if ctx.Err() != nil {
					t.Fatalf("received %d of 3 redeliveries", redelivered)
				}
				continue
			}
			redelivered += len(msgs)
			if err := src.Ack(ctx, msgs); err != nil {
				t.Fatalf("Ack: %v", err)
			}
		}
	}
	waitOffset(t, brokers, group, topic, 3)
}

func TestMethodsRejectForeignMessages(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	src := openSource(t, testConfig(t, brokers, topic, runtest.UniqueName(t, "g")))
	foreign := consumer.Deliver(&consumer.Message{ID: "x"}, consumer.Delivery{Handle: "not ours"})
	ctx := context.Background()
	for name, err := range map[string]error{
		"Ack":        src.Ack(ctx, []*consumer.Message{foreign}),
		"Retry":      src.Retry(ctx, foreign, 0),
		"DeadLetter": src.DeadLetter(ctx, foreign, errors.New("x")),
	} {
		if !errors.Is(err, kafkasource.ErrForeignMessage) {
			t.Errorf("%s of a foreign message: %v, want ErrForeignMessage", name, err)
		}
	}
}

// outgoing returns n messages with keys prefix-0..., no partition key.
func outgoing(prefix string, n int) []sourcetest.Outgoing {
	out := make([]sourcetest.Outgoing, n)
	for i := range out {
		key := prefix + "-" + strconv.Itoa(i)
		out[i] = sourcetest.Outgoing{Key: key, Body: []byte(`{"key":"` + key + `"}`)}
	}
	return out
}

func sortByOffset(msgs []*consumer.Message) []*consumer.Message {
	slices.SortFunc(msgs, func(a, b *consumer.Message) int {
		ka, kb := a.Raw.(kafka.Message), b.Raw.(kafka.Message)
		if ka.Partition != kb.Partition {
			return ka.Partition - kb.Partition
		}
		return int(ka.Offset - kb.Offset)
	})
	return msgs
}
