package sqsoutbox_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sinks/outbox/sqsoutbox"
	"github.com/idemq/idemq/sources/sqssource"
)

// Environment of TestHelperReplierChild: the dead-letter queue of the
// requests.
const envReplyDLQ = "IDEMQ_REPLY_SQS_DLQ"

// replySource returns an sqssource over the queue at url, keyed by the
// idempotency-key attribute, with a 1 s visibility timeout so that a killed
// replier's requests come back quickly; closed when t ends.
func replySource(t testing.TB, url, dlq string) consumer.Source {
	t.Helper()
	src, err := sqssource.New(context.Background(), newClient(t), sqssource.Config{
		QueueURL:           url,
		DeadLetterQueueURL: dlq,
		KeyAttribute:       outbox.HeaderIdempotencyKey,
		VisibilityTimeout:  time.Second,
		WaitTime:           time.Second,
		Logger:             relaytest.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

func replyPublisher(t testing.TB) outbox.Publisher {
	t.Helper()
	pub, err := sqsoutbox.New(newClient(t))
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestHelperReplierChild is the replying worker of TestReplySQS. It does
// nothing when run on its own.
func TestHelperReplierChild(t *testing.T) {
	relaytest.ReplierMain(t, func(t testing.TB, requests string) consumer.Source {
		return replySource(t, requests, os.Getenv(envReplyDLQ))
	}, replyPublisher)
}

// TestReplySQS: requests with the idemq-reply-to and idemq-correlation-id
// message attributes get their replies on the reply queue (by URL) from an
// idemq worker answering through outbox.Reply, with replier processes
// SIGKILLed between the commit and the reply; a repeated request gets the
// same reply id and body with its own correlation id.
func TestReplySQS(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; skipped with -short")
	}
	c := newClient(t)
	requests, replies, dlq := newQueue(t, c, false), newQueue(t, c, false), newQueue(t, c, false)
	str := func(s string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
	}
	relaytest.RunReply(t, relaytest.ReplyBroker{
		Requests: requests,
		ReplyTo:  replies,
		Env:      []string{testenv.EnvSQSEndpoint + "=" + testenv.SQSEndpoint(t), envReplyDLQ + "=" + dlq},
		Send: func(t testing.TB, key, body, corr string) {
			_, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(requests), MessageBody: aws.String(body),
				MessageAttributes: map[string]types.MessageAttributeValue{
					outbox.HeaderIdempotencyKey:  str(key),
					consumer.HeaderReplyTo:       str(replies),
					consumer.HeaderCorrelationID: str(corr),
				}})
			if err != nil {
				t.Fatal(err)
			}
		},
		Source:    func(t testing.TB, requests string) consumer.Source { return replySource(t, requests, dlq) },
		Replies:   func(t testing.TB) consumer.Source { return replySource(t, replies, dlq) },
		Publisher: replyPublisher,
	}, 30, 5, relaytest.ReplyKills(3))
}
