package kafkasource_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// DeleteTopics deletes the topics, a missing one among them, and returns once
// the metadata lists none of them: a topic created again under the same name
// starts empty.
func TestDeleteTopics(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := newTopic(t, brokers, 2)
	publish(t, brokers, topic, sourcetest.Outgoing{Key: "k1", Body: []byte(`{}`)})
	if got := len(readTopic(t, brokers, topic)); got != 1 {
		t.Fatalf("%s holds %d messages before the delete, want 1", topic, got)
	}

	missing := runtest.UniqueName(t, "idemq-missing")
	if err := kafkasource.DeleteTopics(ctx, nil, brokers, topic, kafkasource.DeadLetterTopic(topic), missing); err != nil {
		t.Fatalf("DeleteTopics: %v", err)
	}
	listed := topicNames(t, brokers)
	for _, name := range []string{topic, kafkasource.DeadLetterTopic(topic), missing} {
		if slices.Contains(listed, name) {
			t.Errorf("%s is still listed after DeleteTopics", name)
		}
	}

	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic, Partitions: 2}); err != nil {
		t.Fatalf("create %s again: %v", topic, err)
	}
	if got := len(readTopic(t, brokers, topic)); got != 0 {
		t.Errorf("%s created again holds %d messages, want 0", topic, got)
	}
}

func TestDeleteTopicsRefusesBadArguments(t *testing.T) {
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"no brokers": func() error { return kafkasource.DeleteTopics(ctx, nil, nil, "t") },
		"no name":    func() error { return kafkasource.DeleteTopics(ctx, nil, []string{"127.0.0.1:1"}, "t", "") },
	} {
		var ce *idemq.ConfigError
		if err := call(); !errors.As(err, &ce) {
			t.Errorf("%s: DeleteTopics = %v, want a *idemq.ConfigError", name, err)
		}
	}
	if err := kafkasource.DeleteTopics(ctx, nil, []string{"127.0.0.1:1"}); err != nil {
		t.Errorf("DeleteTopics of no topic = %v, want nil (nothing to do)", err)
	}
}

// topicNames lists the cluster's topics.
func topicNames(t testing.TB, brokers []string) []string {
	t.Helper()
	conn, err := kafka.Dial("tcp", brokers[0])
	if err != nil {
		t.Fatalf("dial %s: %v", brokers[0], err)
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions()
	if err != nil {
		t.Fatalf("list topics: %v", err)
	}
	var names []string
	for _, p := range parts {
		if !slices.Contains(names, p.Topic) {
			names = append(names, p.Topic)
		}
	}
	return names
}
