package kafkasource_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// Kafka counts attempts in process, so a restart starts a message's Attempt
// again at 1. The failures the store counted survive it: a message that
// failed twice before the restart is dead-lettered on its first failure after
// it, at MaxAttempts 3, instead of getting three more tries.
func TestFailureCountSurvivesRestart(t *testing.T) {
	t.Parallel() // its own topic, group and schema
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	db := newTestDB(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, sourcetest.Outgoing{Key: "poison-1", Body: []byte(`{"poison":true}`)})

	var calls atomic.Int64
	path := db.path(func(*consumer.Message) error {
		calls.Add(1)
		return errors.New("downstream rejects this message")
	})
	cfg := consumer.Config{
		Name: group, Concurrency: 1,
		// The third try would come 4 s after the second: the first worker
		// is stopped before that.
		Retry: consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: 2 * time.Second, MaxBackoff: 10 * time.Second, Jitter: -1},
	}

	first := startWorker(t, openSource(t, testConfig(t, brokers, topic, group)), path, cfg)
	deadline := time.Now().Add(waitTimeout)
	for calls.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("handler ran %d times within %s, want 2", calls.Load(), waitTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	first.stop(t)
	if c := calls.Load(); c != 2 {
		t.Fatalf("handler ran %d times before the restart, want 2", c)
	}

	second := startWorker(t, openSource(t, testConfig(t, brokers, topic, group)), path, cfg)
	waitCommitted(t, brokers, group, topic, 1, waitTimeout)
	st := second.runner.Stats()
	second.stop(t)

	if c := calls.Load(); c != 3 {
		t.Errorf("handler ran %d times in all, want 3 (MaxAttempts counts failures across restarts)", c)
	}
	if st.DeadLettered != 1 || st.Retried != 0 {
		t.Errorf("restarted worker: %+v, want the message dead-lettered on its first failure", st)
	}
	dead := readTopic(t, brokers, kafkasource.DeadLetterTopic(topic))
	if len(dead) != 1 {
		t.Fatalf("dead-letter topic holds %d messages, want 1", len(dead))
	}
	if a := header(dead[0], consumer.MetaAttempts); a != "3" {
		t.Fatalf("dead letter after %s attempts, want 3", a)
	}
}
