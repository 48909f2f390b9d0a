package kafkasource_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// A topic that does not exist makes Receive fail with ErrTopicNotFound
// (again every few seconds while it is missing: on brokers that create
// topics on first use, like the test broker, the group creates it soon);
// once it exists, messages flow to the group that joined before it.
func TestReceiveMissingTopic(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := runtest.UniqueName(t, "idemq-missing")
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, kafkasource.DeadLetterTopic(topic))
	src := openSource(t, testConfig(t, brokers, topic, runtest.UniqueName(t, "g")))
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := src.Receive(rctx, 10)
	rcancel()
	if !errors.Is(err, kafkasource.ErrTopicNotFound) {
		t.Fatalf("Receive on a missing topic: %v, want ErrTopicNotFound", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic}, kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(topic)}); err != nil {
		t.Fatal(err)
	}
	publish(t, brokers, topic, sourcetest.Outgoing{Key: "k1", Body: []byte("x")})
	deadline := time.Now().Add(60 * time.Second)
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		msgs, err := src.Receive(rctx, 10)
		rcancel()
		if err == nil && len(msgs) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message after the topic was created; last error %v", err)
		}
	}
}
