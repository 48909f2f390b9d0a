package kafkasource_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/kafkasource"
)

// With the configuration docs/guarantees.md names (brokers, topics and group;
// everything else at its default), a Kafka restart in the middle of a run
// loses nothing and applies nothing twice. Every third message fails its
// first attempt and waits 0.5 to 2 s for its retry, and the broker restarts
// once a third of the messages were handled, so the restart hits fetches,
// background offset commits, retries and messages being handled; offsets
// that were not committed are fetched again and the dedup records absorb the
// redeliveries. Not parallel: the package's other tests would see the
// restart.
func TestDefaultConfigSurvivesBrokerRestart(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 4)
	const n = 3000
	publish(t, brokers, topic, keyed("restart", n, 0)...)

	db := newTestDB(t)
	delays := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}
	var mu sync.Mutex
	tried := map[string]int{}
	path := db.path(func(m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		tried[m.Key]++
		if i := len(tried); tried[m.Key] == 1 && i%3 == 0 {
			return consumer.RetryAfter(delays[i%len(delays)], errors.New("first attempt fails"))
		}
		return nil
	})
	src := openSource(t, kafkasource.Config{
		Brokers: brokers,
		Topics:  []string{topic},
		GroupID: "g-" + topic,
		Logger:  runtest.Logger(t),
	})
	w := startWorker(t, src, path, consumer.Config{Name: "restart", Logger: runtest.Logger(t)})

	w.waitHandled(t, n/3, 2*time.Minute)
	before := w.runner.Stats()
	testenv.Restart(t, testenv.Kafka)
	t.Logf("restarted Kafka; runner before: %+v", before)

	db.waitKeys(t, n, 3*time.Minute, w)
	w.stop(t)
	t.Logf("runner after: %+v", w.runner.Stats())
	if rows, keys := db.counts(t); rows != n || keys != n {
		t.Fatalf("%d effect rows for %d keys, want %d each: a message applied twice", rows, keys, n)
	}
	if dead := w.runner.Stats().DeadLettered; dead != 0 {
		t.Fatalf("%d dead letters, want none", dead)
	}
}
