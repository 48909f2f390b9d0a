package dlq_test

import (
	"context"
	"net/http"
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
