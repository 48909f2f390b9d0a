package kafkadlq_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/sasl/plain"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/internal/dlqtest"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/kafkasource/kafkadlq"
)

// TestHelperReplayChild is TestKafka's replay child (see
// dlqtest.ReplayChild): it is killed as it records a dead letter's
// progress.
func TestHelperReplayChild(t *testing.T) {
	dlqtest.ReplayChild(t, func(t *testing.T, env func(string) string) dlq.Broker {
		return openKafkaDLQ(t, strings.Split(env("IDEMQ_DLQ_BROKERS"), ","), env("IDEMQ_DLQ_TOPIC"),
			&killingTransport{RoundTripper: &kafka.Transport{}})
	})
}

// New refuses a configuration without its required fields with one
// *idemq.ConfigError per field.
func TestNewRefusesMissingFields(t *testing.T) {
	_, err := kafkadlq.New(kafkadlq.Config{})
	dlqtest.CheckMissingFields(t, err, "kafkadlq.Config.Brokers", "kafkadlq.Config.Topic")
}

// Without a Transport, the admin requests, the replayed copies and the
// progress records go through a transport made from the Dialer: its TLS,
// SASL mechanism, client id and timeout.
func TestTransportFromDialer(t *testing.T) {
	d := &kafka.Dialer{TLS: &tls.Config{ServerName: "kafka.example"}, SASLMechanism: plain.Mechanism{Username: "u", Password: "p"},
		ClientID: "dlq-tool", Timeout: 3 * time.Second}
	b, err := kafkadlq.New(kafkadlq.Config{Brokers: []string{"127.0.0.1:1"}, Topic: "orders.dlq", Dialer: d})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	client, writer := kafkadlq.Transports(b)
	for name, rt := range map[string]kafka.RoundTripper{"admin client": client, "writer": writer} {
		tr, ok := rt.(*kafka.Transport)
		if !ok {
			t.Fatalf("the %s's transport is a %T", name, rt)
		}
		if tr.TLS != d.TLS || tr.SASL != d.SASLMechanism || tr.ClientID != d.ClientID || tr.DialTimeout != d.Timeout {
			t.Errorf("the %s's transport has TLS %p, SASL %v, client id %q, dial timeout %v; want the dialer's %p, %v, %q, %v",
				name, tr.TLS, tr.SASL, tr.ClientID, tr.DialTimeout, d.TLS, d.SASLMechanism, d.ClientID, d.Timeout)
		}
	}
}

// Every connection a replay opens, after the Scan that renews the
// transport, goes through the Dialer: here the only way to the brokers.
func TestKafkaReplayDialsThroughDialer(t *testing.T) {
	brokers, topic, dead := kafkaTopics(t, "idemq-dlq-dialer")
	w := testWriter(t, brokers, dead)
	ctx, cancel := context.WithTimeout(context.Background(), dlqtest.WaitTimeout)
	defer cancel()
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("x"), Headers: []kafka.Header{
		{Key: consumer.MetaKey, Value: []byte("k-1")}, {Key: kafkasource.MetaOriginTopic, Value: []byte(topic)},
	}}); err != nil {
		t.Fatal(err)
	}
	// Nothing listens on port 1: only the dialer knows the way.
	var dials atomic.Int64
	d := &kafka.Dialer{Timeout: 10 * time.Second, DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		if addr == "127.0.0.1:1" {
			addr = brokers[0]
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	b, err := kafkadlq.New(kafkadlq.Config{Brokers: []string{"127.0.0.1:1"}, Topic: dead, Group: runtest.UniqueName(t, "g"), Dialer: d})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if res, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{}); err != nil || res.Done != 1 {
		t.Fatalf("replay through the dialer: %+v, %v; want 1 done", res, err)
	}
	if last := brokerenv.LastOffset(t, brokers, topic, 0); last != 1 || dials.Load() == 0 {
		t.Errorf("the origin holds %d copies after %d dials, want 1", last, dials.Load())
	}
}

// killingTransport SIGKILLs the process as it is about to record the
// progress of a dead letter past the ones the child may remove
// (dlqtest.KillAtRemoval): its copy is acknowledged at the origin, its
// removal not recorded.
type killingTransport struct {
	kafka.RoundTripper
	commits atomic.Int64
}

func (k *killingTransport) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	if p, ok := req.(*produce.Request); ok && len(p.Topics) > 0 && strings.HasSuffix(p.Topics[0].Topic, ".progress") {
		dlqtest.KillAtRemoval(&k.commits)
	}
	return k.RoundTripper.RoundTrip(ctx, addr, req)
}

func openKafkaDLQ(t *testing.T, brokers []string, topic string, tr kafka.RoundTripper) *kafkadlq.Broker {
	t.Helper()
	b, err := kafkadlq.New(kafkadlq.Config{Brokers: brokers, Topic: topic, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestKafka(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := runtest.UniqueName(t, "idemq-dlq")
	dead := kafkasource.DeadLetterTopic(topic)
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, dead, kafkadlq.ProgressTopic(dead))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers,
		kafkasource.TopicSpec{Name: topic, Partitions: 2},
		kafkasource.TopicSpec{Name: dead, Partitions: 2},
	); err != nil {
		t.Fatal(err)
	}
	group := runtest.UniqueName(t, "g")
	dlqtest.RunScenario(t, dlqtest.Rig{
		Publish: func(t *testing.T, key, body string) {
			tr := &kafka.Transport{}
			defer tr.CloseIdleConnections()
			w := &kafka.Writer{Transport: tr, Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{},
				RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
			defer w.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := w.WriteMessages(ctx, kafka.Message{Key: []byte(key), Value: []byte(body), Headers: []kafka.Header{
				{Key: kafkasource.DefaultKeyHeader, Value: []byte(key)}, {Key: "tenant", Value: []byte("acme")},
			}}); err != nil {
				t.Fatal(err)
			}
		},
		Source: func(t *testing.T) consumer.Source {
			src, err := kafkasource.New(context.Background(), kafkasource.Config{
				Brokers: brokers, Topics: []string{topic}, GroupID: group,
				SessionTimeout: 6 * time.Second, HeartbeatInterval: 300 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
				JoinGroupBackoff: 200 * time.Millisecond, MaxWait: 250 * time.Millisecond, CommitInterval: 100 * time.Millisecond,
				Logger: runtest.Logger(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { src.Close() })
			return src
		},
		Broker: func(t *testing.T) dlq.Broker { return openKafkaDLQ(t, brokers, dead, nil) },
		// The dead-letter topic keeps what was replayed: rewinding the
		// progress replays it all again.
		Again:        func(t *testing.T, _ dlq.Broker) { rewindProgress(t, brokers, dead, kafkadlq.DefaultGroup, 0, 1) },
		ChildEnv:     []string{"IDEMQ_DLQ_BROKERS=" + strings.Join(brokers, ","), "IDEMQ_DLQ_TOPIC=" + dead},
		KillInWindow: true,
	})
}

// testWriter returns a writer to topic that every write waits for all
// replicas of, closed with its connections when the test ends.
func testWriter(t *testing.T, brokers []string, topic string) *kafka.Writer {
	t.Helper()
	tr := &kafka.Transport{}
	w := &kafka.Writer{Transport: tr, Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	t.Cleanup(func() {
		_ = w.Close()
		tr.CloseIdleConnections()
	})
	return w
}

// kafkaTopics creates a one-partition origin topic and its dead-letter
// topic, deleted (with the progress topic) at cleanup.
func kafkaTopics(t *testing.T, prefix string) (brokers []string, topic, dead string) {
	t.Helper()
	brokers = testenv.KafkaBrokers(t)
	topic = runtest.UniqueName(t, prefix)
	dead = kafkasource.DeadLetterTopic(topic)
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, dead, kafkadlq.ProgressTopic(dead))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic}, kafkasource.TopicSpec{Name: dead}); err != nil {
		t.Fatal(err)
	}
	return brokers, topic, dead
}

// A dead letter whose message had no key header (the runner keyed it on
// topic/partition/offset) replayed twice, as when a replay's copy was sent
// and its progress not recorded: the second copy is absorbed, because the
// copies carry the key the runner recorded, not a key made from their own
// offsets.
func TestKafkaKeylessReplayedTwice(t *testing.T) {
	brokers, topic, dead := kafkaTopics(t, "idemq-dlq-keyless")
	db := dlqtest.NewEffectsDB(t)
	w := testWriter(t, brokers, topic)
	ctx, cancel := context.WithTimeout(context.Background(), dlqtest.WaitTimeout)
	defer cancel()
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(`{"order":1}`), Headers: []kafka.Header{{Key: "tenant", Value: []byte("acme")}}}); err != nil {
		t.Fatal(err)
	}
	group := runtest.UniqueName(t, "g")
	var broken atomic.Bool
	broken.Store(true)
	run := func(until func(consumer.Stats) bool) consumer.Stats {
		src, err := kafkasource.New(context.Background(), kafkasource.Config{
			Brokers: brokers, Topics: []string{topic}, GroupID: group,
			SessionTimeout: 6 * time.Second, HeartbeatInterval: 300 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
			JoinGroupBackoff: 200 * time.Millisecond, MaxWait: 250 * time.Millisecond, CommitInterval: 100 * time.Millisecond,
			Logger: runtest.Logger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		r, err := consumer.NewRunner(src, consumer.Transactional(db.Store, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			if broken.Load() {
				return consumer.Permanent(errors.New("bad SKU"))
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (key, tenant) VALUES ($1, $2)`, string(msg.Body), msg.Headers["tenant"])
			return err
		}), consumer.Config{Name: "orders", Logger: runtest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		runtest.RunUntil(t, func() bool { return until(r.Stats()) }, r)
		return r.Stats()
	}
	run(func(st consumer.Stats) bool { return st.DeadLettered >= 1 })

	// The first replay, then the same one under a group with no progress:
	// the copy sent again, as after a replay that stopped before it could
	// record its progress.
	for _, g := range []string{"first", "again"} {
		b, err := kafkadlq.New(kafkadlq.Config{Brokers: brokers, Topic: dead, Group: runtest.UniqueName(t, g)})
		if err != nil {
			t.Fatal(err)
		}
		res, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{})
		_ = b.Close()
		if err != nil || res.Done != 1 {
			t.Fatalf("replay %s: %d sent, %v; want 1", g, res.Done, err)
		}
	}
	broken.Store(false)
	st := run(func(st consumer.Stats) bool { return st.Received >= 2 })
	if n := db.Effects(t)[`{"order":1}`]; n != 1 {
		t.Errorf("the dead letter replayed twice took effect %d times, want once (runner: %+v)", n, st)
	}
}

// Kafka expires the committed offsets of a group without members after
// offsets.retention.minutes. Deleting the progress group stands for that:
// what was replayed or purged stays done, and only the rest is listed and
// replayed.
func TestKafkaProgressOutlivesGroupOffsets(t *testing.T) {
	brokers, topic, dead := kafkaTopics(t, "idemq-dlq-expiry")
	w := testWriter(t, brokers, dead)
	ctx, cancel := context.WithTimeout(context.Background(), dlqtest.WaitTimeout)
	defer cancel()
	var msgs []kafka.Message
	for i, k := range []string{"k-1", "k-2", "k-3", "k-4"} {
		msgs = append(msgs, kafka.Message{Value: []byte(k), Headers: []kafka.Header{
			{Key: consumer.MetaKey, Value: []byte(k)},
			{Key: consumer.MetaReason, Value: []byte("boom")},
			{Key: kafkasource.MetaOriginTopic, Value: []byte(topic)},
			{Key: kafkasource.MetaOriginPartition, Value: []byte("0")},
			{Key: kafkasource.MetaOriginOffset, Value: []byte(strconv.Itoa(i))},
		}})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	group := runtest.UniqueName(t, "g")
	b := openKafkaDLQGroup(t, brokers, dead, group)
	defer b.Close()
	// k-1 replayed (the committed offset moves), k-3 purged (recorded as
	// done past a kept dead letter).
	if res, err := dlq.Replay(ctx, b, dlq.Filter{Key: "k-1"}, dlq.Options{}); err != nil || res.Done != 1 {
		t.Fatalf("replay k-1: %+v, %v", res, err)
	}
	if res, err := dlq.Purge(ctx, b, dlq.Filter{Key: "k-3"}, dlq.Options{}); err != nil || res.Done != 1 {
		t.Fatalf("purge k-3: %+v, %v", res, err)
	}
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: w.Transport}
	resp, err := c.DeleteGroups(ctx, &kafka.DeleteGroupsRequest{GroupIDs: []string{group}})
	if err != nil || resp.Errors[group] != nil {
		t.Fatalf("delete group %s: %v, %v", group, err, resp.Errors)
	}
	b2 := openKafkaDLQGroup(t, brokers, dead, group)
	defer b2.Close()
	if got := dlqtest.KeysOf(dlqtest.List(t, b2, dlq.Filter{})); !slices.Equal(got, []string{"k-2", "k-4"}) {
		t.Fatalf("after the group's offsets are gone the dead letters are %v, want [k-2 k-4]", got)
	}
	if res, err := dlq.Replay(ctx, b2, dlq.Filter{}, dlq.Options{}); err != nil || res.Done != 2 {
		t.Fatalf("replay the rest: %+v, %v; want 2", res, err)
	}
	if last := brokerenv.LastOffset(t, brokers, topic, 0); last != 3 {
		t.Errorf("the origin holds %d copies, want 3 (k-1, k-2, k-4)", last)
	}
}

func openKafkaDLQGroup(t *testing.T, brokers []string, topic, group string) *kafkadlq.Broker {
	t.Helper()
	b, err := kafkadlq.New(kafkadlq.Config{Brokers: brokers, Topic: topic, Group: group})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rewindProgress records in the progress topic of dead that nothing of the
// partitions was replayed or purged under group.
func rewindProgress(t *testing.T, brokers []string, dead, group string, partitions ...int) {
	t.Helper()
	w := testWriter(t, brokers, kafkadlq.ProgressTopic(dead))
	var msgs []kafka.Message
	for _, p := range partitions {
		msgs = append(msgs, kafka.Message{
			Key:   []byte(dead + "/" + strconv.Itoa(p) + "/" + group),
			Value: []byte(`{"topic":"` + dead + `","group":"` + group + `","partition":` + strconv.Itoa(p) + `,"committed":0}`),
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

// A progress topic that deletes old records would forget what was
// replayed: a replay refuses to record its progress there, and sends
// nothing.
func TestKafkaProgressTopicNotDurable(t *testing.T) {
	brokers, topic, dead := kafkaTopics(t, "idemq-dlq-retained")
	ctx, cancel := context.WithTimeout(context.Background(), dlqtest.WaitTimeout)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: kafkadlq.ProgressTopic(dead)}); err != nil {
		t.Fatal(err)
	}
	w := testWriter(t, brokers, dead)
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("x"), Headers: []kafka.Header{
		{Key: consumer.MetaKey, Value: []byte("k-1")}, {Key: kafkasource.MetaOriginTopic, Value: []byte(topic)},
	}}); err != nil {
		t.Fatal(err)
	}
	b := openKafkaDLQGroup(t, brokers, dead, runtest.UniqueName(t, "g"))
	defer b.Close()
	res, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{})
	if !errors.Is(err, kafkadlq.ErrProgressNotDurable) || res.Done != 0 {
		t.Fatalf("replay with a progress topic that deletes old records: %d done, %v; want 0 and ErrProgressNotDurable", res.Done, err)
	}
	t.Logf("replay: %v", err)
	if last := brokerenv.LastOffset(t, brokers, topic, 0); last != 0 {
		t.Errorf("the origin holds %d copies, want none", last)
	}
}
