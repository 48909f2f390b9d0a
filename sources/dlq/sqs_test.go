package dlq_test

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/dlq"
	"github.com/idemq/idemq/sources/dlq/sqsdlq"
	"github.com/idemq/idemq/sources/sqssource"
)

func init() {
	childBrokers["TestSQS"] = func(t *testing.T, env func(string) string) dlq.Broker {
		// The child's scan hides what it received for 1 s only, so that
		// what it held when killed comes back soon.
		c := sqsClient(env("IDEMQ_DLQ_SQS_ENDPOINT"), func(o *sqs.Options) {
			o.HTTPClient = &killingHTTP{Doer: awshttp.NewBuildableClient()}
		})
		return openSQSDLQ(t, c, env("IDEMQ_DLQ_QUEUE_URL"), time.Second)
	}
}

// killingHTTP SIGKILLs the process as it is about to delete a dead letter
// past killAfter(): its copy is in the origin queue, the dead letter not
// deleted.
type killingHTTP struct {
	Doer interface {
		Do(*http.Request) (*http.Response, error)
	}
	deletes atomic.Int64
}

func (k *killingHTTP) Do(r *http.Request) (*http.Response, error) {
	if r.Header.Get("X-Amz-Target") == "AmazonSQS.DeleteMessage" {
		killAtRemoval(&k.deletes)
	}
	return k.Doer.Do(r)
}

func sqsClient(endpoint string, opts ...func(*sqs.Options)) *sqs.Client {
	return sqs.New(sqs.Options{
		Region: testenv.SQSRegion, BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider(testenv.SQSAccessKeyID, testenv.SQSSecretAccessKey, ""),
	}, opts...)
}

func openSQSDLQ(t *testing.T, c *sqs.Client, url string, vis time.Duration) *sqsdlq.Broker {
	t.Helper()
	b, err := sqsdlq.New(sqsdlq.Config{Client: c, QueueURL: url, KeyAttribute: "idempotency-key", ScanVisibility: vis})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSQS(t *testing.T) {
	endpoint := testenv.SQSEndpoint(t)
	c := sqsClient(endpoint)
	name := runtest.UniqueName(t, "idemq-dlq")
	brokerenv.DeleteSQSQueuesAtCleanup(t, endpoint, name, name+"-dlq")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var urls [2]string
	for i, n := range []string{name, name + "-dlq"} {
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(n)})
		if err != nil {
			t.Fatal(err)
		}
		urls[i] = aws.ToString(out.QueueUrl)
	}
	queue, dead := urls[0], urls[1]
	str := func(s string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
	}
	runScenario(t, rig{
		publish: func(t *testing.T, key, body string) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(body),
				MessageAttributes: map[string]types.MessageAttributeValue{"idempotency-key": str(key), "tenant": str("acme")}}); err != nil {
				t.Fatal(err)
			}
		},
		source: func(t *testing.T) consumer.Source {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			src, err := sqssource.New(ctx, c, sqssource.Config{QueueURL: queue, DeadLetterQueueURL: dead,
				KeyAttribute: "idempotency-key", WaitTime: time.Second, Logger: runtest.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = src.Close() })
			return src
		},
		broker: func(t *testing.T) dlq.Broker { return openSQSDLQ(t, c, dead, 0) },
		// A second copy of each dead letter: replayed as well, absorbed.
		again: func(t *testing.T, b dlq.Broker) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var copies []types.SendMessageBatchRequestEntry
			for len(copies) < len(poison) {
				out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(dead), MaxNumberOfMessages: 10,
					WaitTimeSeconds: 1, VisibilityTimeout: 30, MessageAttributeNames: []string{"All"}})
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range out.Messages {
					copies = append(copies, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(len(copies))),
						MessageBody: m.Body, MessageAttributes: m.MessageAttributes})
					if _, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(dead),
						ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if _, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(dead), Entries: copies}); err != nil {
				t.Fatal(err)
			}
		},
		againBefore:  true,
		childEnv:     []string{"IDEMQ_DLQ_SQS_ENDPOINT=" + endpoint, "IDEMQ_DLQ_QUEUE_URL=" + dead},
		killInWindow: true,
	})
}

// A FIFO queue keyed on the deduplication id (no KeyAttribute): a replayed
// dead letter keeps the key the runner recorded, so a replay of a message
// applied meanwhile is absorbed, and two dead letters of one message (the
// second written when deleting the original failed, past the dead-letter
// queue's deduplication interval) take effect once.
func TestSQSFIFOReplayKeepsKey(t *testing.T) {
	endpoint := testenv.SQSEndpoint(t)
	c := sqsClient(endpoint)
	name := runtest.UniqueName(t, "idemq-dlq")
	brokerenv.DeleteSQSQueuesAtCleanup(t, endpoint, name+".fifo", name+"-dlq.fifo")
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	var urls [2]string
	for i, n := range []string{name + ".fifo", name + "-dlq.fifo"} {
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(n),
			Attributes: map[string]string{string(types.QueueAttributeNameFifoQueue): "true"}})
		if err != nil {
			t.Fatal(err)
		}
		urls[i] = aws.ToString(out.QueueUrl)
	}
	queue, dead := urls[0], urls[1]
	// order-2 and order-3 are poison (see poison) while broken is set.
	keys := []string{keyOf(1), keyOf(2), keyOf(3)}
	for _, k := range keys {
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(`{"order":"` + k + `"}`),
			MessageGroupId: aws.String(k), MessageDeduplicationId: aws.String(k),
			MessageAttributes: map[string]types.MessageAttributeValue{
				"tenant": {DataType: aws.String("String"), StringValue: aws.String("acme")}}}); err != nil {
			t.Fatal(err)
		}
	}
	// run runs a runner until done, then closes its source. A message that
	// SQS handed to one of its receive calls that Close cancelled comes
	// back after the visibility timeout, which is short for that reason.
	db := newEffectsDB(t)
	var broken atomic.Bool
	run := func(t *testing.T, done func(consumer.Stats) bool) consumer.Stats {
		src, err := sqssource.New(ctx, c, sqssource.Config{QueueURL: queue, DeadLetterQueueURL: dead,
			WaitTime: time.Second, VisibilityTimeout: 2 * time.Second, Logger: runtest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		r := db.runner(t, src, &broken)
		runtest.RunUntil(t, func() bool { return done(r.Stats()) }, r)
		return r.Stats()
	}
	broken.Store(true)
	run(t, func(st consumer.Stats) bool { return st.Handled >= 1 && st.DeadLettered >= 2 })

	// A second dead letter of each poison message, with a deduplication
	// id of its own.
	var copies []types.SendMessageBatchRequestEntry
	for len(copies) < 2 {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(dead), MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, VisibilityTimeout: 30, MessageAttributeNames: []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			copies = append(copies, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(len(copies))),
				MessageBody: m.Body, MessageAttributes: m.MessageAttributes,
				MessageGroupId:         aws.String(m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]),
				MessageDeduplicationId: aws.String("copy-" + aws.ToString(m.MessageId))})
			if _, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(dead),
				ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(dead), Entries: copies}); err != nil {
		t.Fatal(err)
	}

	b := openSQSDLQ(t, c, dead, 0)
	if got, want := keysOf(list(t, b, dlq.Filter{})), []string{keyOf(2), keyOf(2), keyOf(3), keyOf(3)}; !slices.Equal(got, want) {
		t.Errorf("dead-letter keys %v, want the recorded keys %v", got, want)
	}
	broken.Store(false)
	// One dead letter of each replayed and applied, then the other two.
	for round, sel := range []dlq.Filter{{Key: keyOf(2), Limit: 1}, {Key: keyOf(3), Limit: 1}, {}} {
		res, err := dlq.Replay(ctx, b, sel, dlq.Options{})
		if err != nil {
			t.Fatalf("replay %+v: %v", sel, err)
		}
		st := run(t, func(st consumer.Stats) bool { return st.Received >= uint64(res.Done) })
		t.Logf("replay %d sent %d; the runner: %+v", round, res.Done, st)
	}
	if ls := list(t, b, dlq.Filter{}); len(ls) != 0 {
		t.Errorf("%d dead letters left: %v", len(ls), keysOf(ls))
	}
	eff := db.effects(t)
	want := map[string]int{keyOf(1): 1, keyOf(2): 1, keyOf(3): 1}
	if !maps.Equal(eff, want) {
		t.Errorf("effects by key %v, want %v", eff, want)
	}
}
