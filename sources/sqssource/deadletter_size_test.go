package sqssource_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/sqssource"
)

// sizeLimited enforces SQS's message size limits on SendMessage, which
// ElasticMQ does not (it accepts any size and ignores a queue's
// MaximumMessageSize): the body plus every attribute's name, data type and
// value must not exceed 256 KiB, or the queue's own MaximumMessageSize, which
// GetQueueAttributes reports as SQS does. Real SQS answers an
// InvalidParameterValue error.
type sizeLimited struct {
	sqssource.Client
	limits map[string]int // queue URL → MaximumMessageSize
}

func (c sizeLimited) limit(url string) int {
	if n, ok := c.limits[url]; ok {
		return n
	}
	return sqssource.MaxMessageSize
}

func (c sizeLimited) SendMessage(ctx context.Context, in *sqs.SendMessageInput, opts ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	n := len(aws.ToString(in.MessageBody))
	for name, v := range in.MessageAttributes {
		n += len(name) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	if limit := c.limit(aws.ToString(in.QueueUrl)); n > limit {
		return nil, fmt.Errorf("InvalidParameterValue: One or more parameters are invalid. Reason: Message must be shorter than %d bytes (was %d)", limit, n)
	}
	return c.Client.SendMessage(ctx, in, opts...)
}

func (c sizeLimited) GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, opts ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error) {
	out, err := c.Client.GetQueueAttributes(ctx, in, opts...)
	if err == nil && slices.Contains(in.AttributeNames, types.QueueAttributeNameMaximumMessageSize) {
		if out.Attributes == nil {
			out.Attributes = map[string]string{}
		}
		out.Attributes[string(types.QueueAttributeNameMaximumMessageSize)] = strconv.Itoa(c.limit(aws.ToString(in.QueueUrl)))
	}
	return out, err
}

// A message of the maximum size (256 KiB of body and attributes together)
// can still be dead-lettered: the copy's reason and attributes are cut to
// fit, instead of the copy being refused forever while the original is
// handed back until retention deletes it.
func TestMaximumSizeMessageIsDeadLettered(t *testing.T) {
	needServices(t)
	q := newQueue(t, queueOptions{})
	const key = "max-size"
	// SQS counts the body plus each attribute's name, type and value.
	attrSize := len(keyAttribute) + len("String") + len(key) + len("note") + len("String") + len("x")
	body := strings.Repeat("b", sqssource.MaxMessageSize-attrSize)
	publish(t, q.URL, false, outMsg{Key: key, Body: body, Headers: map[string]string{"note": "x"}})

	src, err := sqssource.New(testContext(t, 30*time.Second), sizeLimited{Client: sqsClient(t)}, sourceConfig(t, q))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	ctx := testContext(t, 30*time.Second)
	msgs, err := src.Receive(ctx, 1)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("Receive = %d messages, %v", len(msgs), err)
	}
	reason := &consumer.DeadLetterError{Key: key, Attempts: 5, Err: errors.New(strings.Repeat("a very long reason ", 200))}
	if err := src.DeadLetter(ctx, msgs[0], reason); err != nil {
		t.Fatalf("DeadLetter of a maximum-size message: %v", err)
	}
	got := drain(t, q.DLQURL, 1, 20*time.Second)
	if len(got) != 1 || aws.ToString(got[0].Body) != body {
		t.Fatalf("dead-letter queue holds %d messages, want the maximum-size message with its body", len(got))
	}
	attrs := got[0].MessageAttributes
	if r := aws.ToString(attrs[consumer.MetaReason].StringValue); r == "" || !strings.HasPrefix(reason.Error(), strings.TrimSuffix(r, "…")) {
		t.Errorf("reason attribute %q is not a prefix of the reason", r)
	}
	t.Logf("dead letter kept attributes %v; reason cut to %d bytes", keys(attrs), len(aws.ToString(attrs[consumer.MetaReason].StringValue)))
	if n := queueDepth(t, q.URL); n != 0 {
		t.Errorf("%d messages left in the queue, want 0", n)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A body larger than the dead-letter queue's MaximumMessageSize cannot be
// copied there at all: with a redrive policy the message is left to it (made
// visible again after RedriveDelay, SQS moves it after maxReceiveCount
// receives); without one DeadLetter fails and says why.
func TestBodyAboveDeadLetterQueueLimit(t *testing.T) {
	needServices(t)
	c := sqsClient(t)
	ctx := testContext(t, 60*time.Second)
	name := runtest.UniqueName(t, "")
	dlq := createQueue(ctx, t, c, name+"-dlq", map[string]string{"MaximumMessageSize": "1024"})
	client := sizeLimited{Client: c, limits: map[string]int{dlq: 1024}}
	arn, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(dlq), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	withRedrive := createQueue(ctx, t, c, name+"-r", map[string]string{
		"RedrivePolicy": fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"5"}`, arn.Attributes["QueueArn"]),
	})
	without := createQueue(ctx, t, c, name+"-n", nil)
	body := strings.Repeat("b", 2000)

	for _, tc := range []struct {
		url     string
		redrive bool
	}{{withRedrive, true}, {without, false}} {
		publish(t, tc.url, false, outMsg{Key: "big", Body: body})
		cfg := sourceConfig(t, testQueue{URL: tc.url, DLQURL: dlq})
		cfg.RedriveDelay = time.Second
		src, err := sqssource.New(ctx, client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close() })
		msgs, err := src.Receive(ctx, 1)
		if err != nil || len(msgs) != 1 {
			t.Fatalf("Receive = %d messages, %v", len(msgs), err)
		}
		err = src.DeadLetter(ctx, msgs[0], consumer.Permanent(errors.New("poison")))
		switch {
		case tc.redrive && err != nil:
			t.Fatalf("DeadLetter with a redrive policy = %v, want it left to the policy", err)
		case !tc.redrive && (err == nil || !strings.Contains(err.Error(), "MaximumMessageSize")):
			t.Fatalf("DeadLetter without a redrive policy = %v, want an error naming MaximumMessageSize", err)
		}
		if n := queueDepth(t, dlq); n != 0 {
			t.Fatalf("dead-letter queue holds %d messages, want none (the copy cannot fit)", n)
		}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		back, err := src.Receive(rctx, 1)
		cancel()
		if err != nil || len(back) != 1 || string(back[0].Body) != body {
			t.Fatalf("the message did not come back to its queue (%d messages, %v)", len(back), err)
		}
		if err := src.Ack(ctx, back); err != nil {
			t.Fatal(err)
		}
		t.Logf("redrive policy %v: DeadLetter = %v", tc.redrive, err)
	}
}
