package memsource_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// TestConformance runs the source conformance suite against memsource.
func TestConformance(t *testing.T) {
	b := memsource.New(memsource.Config{VisibilityTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = b.Close() })
	var topics atomic.Int64
	sourcetest.Run(t, sourcetest.Harness{
		Features: sourcetest.Features{
			CompetingConsumers:    true,
			OrderedByPartitionKey: true,
			RetryDelayHonoured:    true,
			RedeliveryTimeout:     time.Second,
			DeadLetterReadable:    true,
			Restart:               true,
			PartialAck:            true,
		},
		NewTopic: func(t *testing.T) string {
			return fmt.Sprintf("topic-%d", topics.Add(1))
		},
		NewSource: func(t *testing.T, topic string) consumer.Source {
			return b.Source(topic)
		},
		Publish: func(t *testing.T, topic string, msgs ...sourcetest.Outgoing) {
			out := make([]memsource.Outgoing, len(msgs))
			for i, m := range msgs {
				out[i] = memsource.Outgoing{Key: m.Key, Body: m.Body, Headers: m.Headers, PartitionKey: m.PartitionKey}
			}
			b.Publish(topic, out...)
		},
		DeadLetters: func(t *testing.T, topic string) []sourcetest.Outgoing {
			var out []sourcetest.Outgoing
			for _, d := range b.DeadLetters(topic) {
				h := map[string]string{consumer.MetaReason: d.Reason}
				for k, v := range d.Headers {
					h[k] = v
				}
				out = append(out, sourcetest.Outgoing{Key: d.Key, Body: d.Body, Headers: h, PartitionKey: d.PartitionKey})
			}
			return out
		},
		RestartBroker: func(t *testing.T) {
			b.SetUnavailable(true)
			time.Sleep(100 * time.Millisecond)
			b.Restart()
			b.SetUnavailable(false)
		},
	})
}
