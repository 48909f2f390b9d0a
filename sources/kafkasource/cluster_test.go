package kafkasource_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/kafkasource"
)

// A node of a three-node Kafka cluster dies (SIGKILL, no controlled
// shutdown) in the middle of a run with the default configuration: its
// partitions' leadership moves to the in-sync replicas (replication factor
// 3, min.insync.replicas 2), the group coordinator moves if it lived there,
// and the worker goes on. Every message is applied exactly once, none is
// dead-lettered. The node restarts at the end. Runs against the services
// script's kafka-cluster profile, which no other test of the package uses:
// parallel with the tests on the single broker.
func TestClusterNodeDiesMidRun(t *testing.T) {
	skipShort(t)
	t.Parallel() // its own cluster, topic, group and schema
	brokers := testenv.KafkaClusterBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := runtest.UniqueName(t, "cluster")
	if err := kafkasource.CreateTopics(ctx, nil, brokers,
		kafkasource.TopicSpec{Name: topic, Partitions: 6, ReplicationFactor: 3},
		kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(topic), Partitions: 1, ReplicationFactor: 3}); err != nil {
		t.Fatal(err)
	}
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, kafkasource.DeadLetterTopic(topic))
	const n = 3000
	publish(t, brokers, topic, keyed("cluster", n, 0)...)

	db := newTestDB(t)
	var mu sync.Mutex
	tried := map[string]int{}
	path := db.path(func(m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		tried[m.Key]++
		if i := len(tried); tried[m.Key] == 1 && i%5 == 0 {
			return consumer.RetryAfter(500*time.Millisecond, errors.New("first attempt fails"))
		}
		return nil
	})
	src := openSource(t, kafkasource.Config{Brokers: brokers, Topics: []string{topic}, GroupID: "g-" + topic, Logger: runtest.Logger(t)})
	w := startWorker(t, src, path, consumer.Config{Name: "cluster", Logger: runtest.Logger(t)})

	w.waitHandled(t, n/3, 2*time.Minute)
	node := testenv.KafkaClusterNode(1)
	testenv.Kill(t, node)
	killed := time.Now()
	t.Logf("killed %s; runner %+v", node, w.runner.Stats())

	db.waitKeys(t, n, 3*time.Minute, w)
	t.Logf("all %d handled %s after the node died", n, time.Since(killed).Round(time.Millisecond))
	w.stop(t)
	st := w.runner.Stats()
	t.Logf("runner %+v; source %+v", st, src.Stats())
	if rows, keys := db.counts(t); rows != n || keys != n {
		t.Fatalf("%d effect rows for %d keys, want %d each: a message applied twice", rows, keys, n)
	}
	if st.DeadLettered != 0 {
		t.Fatalf("%d dead letters, want none", st.DeadLettered)
	}
	testenv.Start(t, node)
}
