package kafkasource_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// A Config.KeyFunc that panics on one malformed record must not crash the
// fetch loop (and the process): the record is dead-lettered with the panic as
// its reason, and the records around it are handled.
func TestKeyFuncPanicIsDeadLettered(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic,
		sourcetest.Outgoing{Body: []byte("a")}, sourcetest.Outgoing{Body: []byte("boom")}, sourcetest.Outgoing{Body: []byte("b")})

	cfg := testConfig(t, brokers, topic, group)
	cfg.KeyFunc = func(m kafka.Message) string {
		if string(m.Value) == "boom" {
			var fields []string
			return fields[3] // index out of range
		}
		return "key-" + string(m.Value)
	}
	store, err := memdedup.New(memdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	path := consumer.Transactional(store, func(ctx context.Context, tx *memdedup.Tx, m *consumer.Message) error {
		return tx.Add("effects/"+m.Key, 1)
	})
	w := startWorker(t, openSource(t, cfg), path, consumer.Config{Name: group, KeyFunc: consumer.RequireKey})
	waitCommitted(t, brokers, group, topic, 1, waitTimeout)
	w.stop(t)

	if store.Value("effects/key-a") != 1 || store.Value("effects/key-b") != 1 {
		t.Fatalf("effects %v, want key-a and key-b once", store.Values())
	}
	dead := readTopic(t, brokers, kafkasource.DeadLetterTopic(topic))
	if len(dead) != 1 || string(dead[0].Value) != "boom" {
		t.Fatalf("dead-letter topic holds %d messages, want only boom", len(dead))
	}
	if reason := header(dead[0], consumer.MetaReason); !strings.Contains(reason, "index out of range") ||
		!strings.Contains(reason, consumer.ErrMissingKey.Error()) {
		t.Fatalf("dead-letter reason %q: want ErrMissingKey and the panic", reason)
	}
}

// consumer.RequireKey dead-letters a record without a key header instead of
// deduplicating it on its offset.
func TestRequireKeyDeadLettersKeylessRecords(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := runtest.UniqueName(t, "g")
	publish(t, brokers, topic, sourcetest.Outgoing{Key: "k1", Body: []byte("a")}, sourcetest.Outgoing{Body: []byte("keyless")})
	store, err := memdedup.New(memdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	path := consumer.Transactional(store, func(ctx context.Context, tx *memdedup.Tx, m *consumer.Message) error {
		return tx.Add("effects/"+m.Key, 1)
	})
	w := startWorker(t, openSource(t, testConfig(t, brokers, topic, group)), path,
		consumer.Config{Name: group, KeyFunc: consumer.RequireKey, DrainTimeout: 10 * time.Second})
	waitCommitted(t, brokers, group, topic, 1, waitTimeout)
	w.stop(t)
	if got := store.Values(); len(got) != 1 || got["effects/k1"] != 1 {
		t.Fatalf("effects %v, want only k1", got)
	}
	dead := readTopic(t, brokers, kafkasource.DeadLetterTopic(topic))
	if len(dead) != 1 || string(dead[0].Value) != "keyless" ||
		!strings.Contains(header(dead[0], consumer.MetaReason), consumer.ErrMissingKey.Error()) {
		t.Fatalf("dead letters %d, want the keyless record with ErrMissingKey", len(dead))
	}
}
