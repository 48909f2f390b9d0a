package amqpsource_test

import (
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// TestConformance runs the source conformance suite on quorum queues (which
// count redeliveries, so Attempt grows on every redelivery). Its reconnect
// test restarts the broker in the middle of the stream.
func TestConformance(t *testing.T) {
	url := brokerURL(t)
	sourcetest.Run(t, sourcetest.Harness{
		Features: sourcetest.Features{
			CompetingConsumers: true,
			RetryDelayHonoured: true,
			RedeliveryTimeout:  5 * time.Second,
			DeadLetterReadable: true,
			Restart:            true,
		},
		NewTopic: func(t *testing.T) string { return newQueue(t, url, quorum, 0) },
		NewSource: func(t *testing.T, topic string) consumer.Source {
			return newSource(t, amqpsource.Config{
				URL:            url,
				Queue:          topic,
				Prefetch:       32,
				ReconnectDelay: 50 * time.Millisecond,
				Logger:         runtest.Logger(t),
			})
		},
		Publish: func(t *testing.T, topic string, msgs ...sourcetest.Outgoing) {
			publish(t, url, topic, msgs...)
		},
		DeadLetters: func(t *testing.T, topic string) []sourcetest.Outgoing {
			var out []sourcetest.Outgoing
			for _, d := range peek(t, url, topic+".dlq") {
				h := map[string]string{}
				for k, v := range d.Headers {
					if s, ok := v.(string); ok {
						h[k] = s
					}
				}
				out = append(out, sourcetest.Outgoing{Key: h[amqpsource.DefaultKeyHeader], Body: d.Body, Headers: h})
			}
			return out
		},
		// The suite runs its restart test alone, after the parallel ones:
		// a real broker restart disturbs nothing else in this package.
		RestartBroker: func(t *testing.T) { testenv.Restart(t, testenv.RabbitMQ) },
	})
}
