package sqssource_test

import (
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/sourcetest"
)

// TestConformance runs the source conformance suite against ElasticMQ, on
// standard queues and on FIFO queues (where PartitionKey is the
// MessageGroupId and order per group is promised).
func TestConformance(t *testing.T) {
	needServices(t)
	t.Run("Standard", func(t *testing.T) {
		t.Parallel()
		sourcetest.Run(t, newHarness(false))
	})
	t.Run("FIFO", func(t *testing.T) {
		t.Parallel()
		sourcetest.Run(t, newHarness(true))
	})
}

// harnessVisibility is the visibility timeout of the sources under test; Close
// releases unsettled messages at once, so redelivery after Close is fast.
const harnessVisibility = 3 * time.Second

func newHarness(fifo bool) sourcetest.Harness {
	var (
		mu     sync.Mutex
		queues = map[string]testQueue{}                // by topic
		dead   = map[string]map[string]types.Message{} // topic -> MessageId -> dead letter
	)
	lookup := func(t *testing.T, topic string) testQueue {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		q, ok := queues[topic]
		if !ok {
			t.Fatalf("unknown topic %q", topic)
		}
		return q
	}
	return sourcetest.Harness{
		Features: sourcetest.Features{
			CompetingConsumers:    true,
			OrderedByPartitionKey: fifo,
			RetryDelayHonoured:    true,
			RedeliveryTimeout:     harnessVisibility + 2*time.Second,
			DeadLetterReadable:    true,
			// ElasticMQ keeps queues in memory: a restart loses them, which
			// real SQS never does, so the reconnect test cannot run here.
			Restart: false,
		},
		NewTopic: func(t *testing.T) string {
			q := newQueue(t, queueOptions{FIFO: fifo})
			mu.Lock()
			defer mu.Unlock()
			queues[q.Name] = q
			return q.Name
		},
		NewSource: func(t *testing.T, topic string) consumer.Source {
			cfg := sourceConfig(t, lookup(t, topic))
			cfg.VisibilityTimeout = harnessVisibility
			return newSource(t, cfg)
		},
		Publish: func(t *testing.T, topic string, msgs ...sourcetest.Outgoing) {
			q := lookup(t, topic)
			out := make([]outMsg, len(msgs))
			for i, m := range msgs {
				group := m.PartitionKey
				if group == "" {
					group = m.Key // unordered: one group per message
				}
				out[i] = outMsg{Key: m.Key, Body: string(m.Body), Headers: m.Headers, Group: group}
			}
			publish(t, q.URL, q.FIFO, out...)
		},
		DeadLetters: func(t *testing.T, topic string) []sourcetest.Outgoing {
			q := lookup(t, topic)
			ctx := testContext(t, 30*time.Second)
			// Dead letters stay invisible once received here, so keep every
			// one seen per topic and answer with all of them.
			for {
				got, err := sqsClient(t).ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
					QueueUrl: aws.String(q.DLQURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 3600,
					MessageAttributeNames:       []string{"All"},
					MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
				})
				if err != nil {
					t.Fatalf("receive dead letters: %v", err)
				}
				if len(got.Messages) == 0 {
					break
				}
				mu.Lock()
				if dead[topic] == nil {
					dead[topic] = map[string]types.Message{}
				}
				for _, m := range got.Messages {
					dead[topic][aws.ToString(m.MessageId)] = m
				}
				mu.Unlock()
			}
			mu.Lock()
			defer mu.Unlock()
			var out []sourcetest.Outgoing
			for _, m := range dead[topic] {
				headers := map[string]string{}
				for k, v := range m.MessageAttributes {
					headers[k] = aws.ToString(v.StringValue)
				}
				out = append(out, sourcetest.Outgoing{
					Key:          headers[keyAttribute],
					Body:         []byte(aws.ToString(m.Body)),
					Headers:      headers,
					PartitionKey: m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
				})
			}
			return out
		},
	}
}
