package kafkasource_test

import (
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// TestConformance runs the source conformance suite against the real broker.
// Sources opened on one topic share a consumer group named after the topic.
func TestConformance(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	sourcetest.Run(t, sourcetest.Harness{
		Features: sourcetest.Features{
			CompetingConsumers:    true,
			OrderedByPartitionKey: true,
			RetryDelayHonoured:    true,
			// A closed source leaves the group at once; the rebalance that
			// hands its partitions over takes a few seconds at most.
			RedeliveryTimeout:  10 * time.Second,
			DeadLetterReadable: true,
			Restart:            true,
		},
		NewTopic: func(t *testing.T) string { return newTopic(t, brokers, testPartitions) },
		NewSource: func(t *testing.T, topic string) consumer.Source {
			return openSource(t, testConfig(t, brokers, topic, "g-"+topic))
		},
		Publish: func(t *testing.T, topic string, msgs ...sourcetest.Outgoing) {
			publish(t, brokers, topic, msgs...)
		},
		RestartBroker: func(t *testing.T) { testenv.Restart(t, testenv.Kafka) },
		DeadLetters: func(t *testing.T, topic string) []sourcetest.Outgoing {
			var out []sourcetest.Outgoing
			for _, m := range readTopic(t, brokers, kafkasource.DeadLetterTopic(topic)) {
				headers := make(map[string]string, len(m.Headers))
				for _, h := range m.Headers {
					headers[h.Key] = string(h.Value)
				}
				out = append(out, sourcetest.Outgoing{
					Key:          headers[kafkasource.DefaultKeyHeader],
					Body:         m.Value,
					Headers:      headers,
					PartitionKey: string(m.Key),
				})
			}
			return out
		},
	})
}
