package sqsoutbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sinks/outbox/sqsoutbox"
	"github.com/idemq/idemq/sources/sqssource"
)

func newClient(t testing.TB) *sqs.Client {
	t.Helper()
	c, err := sqssource.NewClient(context.Background(), testenv.SQSEndpoint(t),
		config.WithRegion(testenv.SQSRegion),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(testenv.SQSAccessKeyID, testenv.SQSSecretAccessKey, "")))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newQueue(t testing.TB, c *sqs.Client, fifo bool) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "outbox-" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-") + "-" + hex.EncodeToString(b)
	attrs := map[string]string{}
	if fifo {
		name += ".fifo"
		attrs[string(types.QueueAttributeNameFifoQueue)] = "true"
	}
	out, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatal(err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() { _, _ = c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}) })
	return url
}

// receiveAll receives and deletes n messages (or fails), in receive order.
func receiveAll(t testing.TB, c *sqs.Client, url string, n int) []relaytest.Got {
	t.Helper()
	ctx := context.Background()
	var got []relaytest.Got
	deadline := time.Now().Add(relaytest.WaitTimeout)
	for len(got) < n {
		if time.Now().After(deadline) {
			t.Fatalf("received %d of %d messages", len(got), n)
		}
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameMessageGroupId},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			g := relaytest.Got{Body: aws.ToString(m.Body)}
			if a, ok := m.MessageAttributes[outbox.HeaderIdempotencyKey]; ok {
				g.ID = aws.ToString(a.StringValue)
			}
			if a, ok := m.MessageAttributes[outbox.HeaderPartitionKey]; ok {
				g.Key = aws.ToString(a.StringValue)
			} else {
				g.Key = m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
			}
			got = append(got, g)
			if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return got
}

// Two relays publish every row once to a FIFO queue with its stable id and
// in order per key (the MessageGroupId); a row for a queue that does not
// exist is parked after MaxAttempts.
func TestRelaySQS(t *testing.T) {
	c := newClient(t)
	url := newQueue(t, c, true)
	pool, _, _ := relaytest.NewPool(t)
	pub, err := sqsoutbox.New(c)
	if err != nil {
		t.Fatal(err)
	}
	want := relaytest.Messages("s", url, 200, 6)
	relaytest.Insert(t, pool, want)
	relaytest.Insert(t, pool, []outbox.Message{{ID: "poison", Destination: "no-such-queue-for-outbox", Key: "k-poison", Body: []byte("x")}})
	relaytest.StartRelays(t, pool, pub, 2, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		c := relaytest.Counts(t, pool)
		return c.Pending == 0 && c.Parked == 1
	})
	if c := relaytest.Counts(t, pool); c.Sent != int64(len(want)) {
		t.Fatalf("%s, want %d sent", relaytest.Describe(t, pool), len(want))
	}
	got := receiveAll(t, c, url, len(want))
	relaytest.Check(t, want, got, false)
}

// On a standard queue the partition key travels as an attribute; every
// row arrives once.
func TestRelaySQSStandard(t *testing.T) {
	c := newClient(t)
	url := newQueue(t, c, false)
	pool, _, _ := relaytest.NewPool(t)
	pub, err := sqsoutbox.New(c)
	if err != nil {
		t.Fatal(err)
	}
	want := relaytest.Messages("s", url, 50, 1000) // one key each: no order to check
	relaytest.Insert(t, pool, want)
	relaytest.StartRelays(t, pool, pub, 1, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == int64(len(want))
	})
	relaytest.Check(t, want, receiveAll(t, c, url, len(want)), false)
}

// A relay whose SQS endpoint cannot be reached reports an outage: the
// SendMessageBatch call's error applies to every entry of the call, so every
// row stays pending with no attempt counted and none is marked sent; a
// publisher on the real endpoint then sends them all.
func TestRelaySQSOutage(t *testing.T) {
	c := newClient(t)
	url := newQueue(t, c, false)
	pool, _, _ := relaytest.NewPool(t)
	want := relaytest.Messages("o", url, 25, 1000) // two SendMessageBatch calls of 10 and one of 5
	relaytest.Insert(t, pool, want)

	// A client pointed at a closed port stands in for an endpoint that is down.
	down, err := sqssource.NewClient(context.Background(), "http://127.0.0.1:1",
		config.WithRegion(testenv.SQSRegion), config.WithRetryMaxAttempts(1),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(testenv.SQSAccessKeyID, testenv.SQSSecretAccessKey, "")))
	if err != nil {
		t.Fatal(err)
	}
	downPub, err := sqsoutbox.New(down)
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(pool, downPub, relaytest.FastConfig())
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, err := r.RelayOnce(t.Context())
		if c := relaytest.Counts(t, pool); c.Sent != 0 || c.Pending != int64(len(want)) {
			t.Fatalf("relay with the endpoint down (%v): %s; want all %d pending, none sent", err, relaytest.Describe(t, pool), len(want))
		}
		if !errors.Is(err, outbox.ErrUnavailable) {
			t.Fatalf("relay with the endpoint down: %v, want ErrUnavailable", err)
		}
	}
	var attempts int
	if err := pool.QueryRow(t.Context(), `SELECT coalesce(max(attempts), 0) FROM idemq_outbox`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Fatalf("after an outage: max attempts %d, want 0", attempts)
	}
	pub, err := sqsoutbox.New(c)
	if err != nil {
		t.Fatal(err)
	}
	relaytest.StartRelays(t, pool, pub, 1, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == int64(len(want))
	})
	relaytest.Check(t, want, receiveAll(t, c, url, len(want)), false)
}

// A header value SQS would refuse (a control character, invalid UTF-8)
// arrives escaped as Go escapes it, instead of failing the row for ever.
func TestHeaderValuesOutsideSQSRange(t *testing.T) {
	c := newClient(t)
	url := newQueue(t, c, false)
	pub, err := sqsoutbox.New(c)
	if err != nil {
		t.Fatal(err)
	}
	m := outbox.Message{ID: "h1", Destination: url, Body: []byte("x"),
		Headers: map[string]string{"note": "a\x01b", "raw": "c\xffd", "plain": "ok"}}
	if err := pub.Publish(t.Context(), []outbox.Message{m}); err != nil {
		t.Fatalf("publishing a header with a control character: %v", err)
	}
	out, err := c.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{
		QueueUrl: aws.String(url), WaitTimeSeconds: 2, MessageAttributeNames: []string{"All"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 {
		t.Fatalf("received %d messages, want 1", len(out.Messages))
	}
	attrs := out.Messages[0].MessageAttributes
	for k, want := range map[string]string{"note": `a\x01b`, "raw": `c\xffd`, "plain": "ok"} {
		if got := aws.ToString(attrs[k].StringValue); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
}
