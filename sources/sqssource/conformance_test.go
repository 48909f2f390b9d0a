package sqssource_test

import (
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sourcetest"
)

// TestConformance runs the source conformance suite against ElasticMQ, on
// standard queues and on FIFO queues (where PartitionKey is the
// MessageGroupId and order per group is promised).
//
// Both flavours run at once, so their Restart cases share one ElasticMQ
// restart (see restartGroup): a restart of its own in either would hit the
// other flavour's tests.
func TestConformance(t *testing.T) {
	needServices(t)
	g := newRestartGroup()
	for _, fifo := range []bool{false, true} {
		name := "Standard"
		if fifo {
			name = "FIFO"
		}
		t.Run(name, func(t *testing.T) {
			g.join()
			t.Parallel()
			defer g.leave()
			sourcetest.Run(t, newHarness(fifo, g))
		})
	}
}

// restartGroup lets the suites running at once restart ElasticMQ together:
// each Restart case waits until every member still running has reached its
// restart, then one restart serves them all. A member whose suite ends
// without restarting (failed earlier, or filtered out by -run) leaves and is
// no longer waited for.
type restartGroup struct {
	mu         sync.Mutex
	cond       *sync.Cond
	members    int // suites still running
	arrived    int // members waiting in this round
	round      int // restarts begun
	restarting bool
}

func newRestartGroup() *restartGroup {
	g := &restartGroup{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *restartGroup) join() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members++
}

func (g *restartGroup) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members--
	g.cond.Broadcast()
}

// restart returns once ElasticMQ has been restarted after every running
// member called it (or left).
func (g *restartGroup) restart(t *testing.T) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.arrived++
	round := g.round
	g.cond.Broadcast()
	for g.round == round && g.arrived < g.members {
		g.cond.Wait()
	}
	if g.round == round {
		// Last to arrive: restart for everyone in this round.
		g.round++
		g.arrived = 0
		g.restarting = true
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			g.restarting = false
			g.cond.Broadcast()
		}()
		testenv.Restart(t, testenv.ElasticMQ)
		return
	}
	for g.restarting {
		g.cond.Wait()
	}
}

// harnessVisibility is the visibility timeout of the sources under test; Close
// releases unsettled messages at once, so redelivery after Close is fast.
const harnessVisibility = 3 * time.Second

func newHarness(fifo bool, restarts *restartGroup) sourcetest.Harness {
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
			// services.sh runs ElasticMQ with queues and messages persisted,
			// so a restart keeps them, as real SQS does.
			Restart: true,
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
		RestartBroker: restarts.restart,
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
