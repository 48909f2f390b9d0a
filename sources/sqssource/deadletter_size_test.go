package sqssource_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/sqssource"
)

// sizeLimited enforces SQS's message size limit on SendMessage, which
// ElasticMQ does not (it accepts any size): the body plus every attribute's
// name, data type and value must not exceed 256 KiB. Real SQS answers an
// InvalidParameterValue error.
type sizeLimited struct {
	sqssource.Client
}

func (c sizeLimited) SendMessage(ctx context.Context, in *sqs.SendMessageInput, opts ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	n := len(aws.ToString(in.MessageBody))
	for name, v := range in.MessageAttributes {
		n += len(name) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	if n > sqssource.MaxMessageSize {
		return nil, fmt.Errorf("InvalidParameterValue: One or more parameters are invalid. Reason: Message must be shorter than %d bytes (was %d)", sqssource.MaxMessageSize, n)
	}
	return c.Client.SendMessage(ctx, in, opts...)
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

	src, err := sqssource.New(testContext(t, 30*time.Second), sizeLimited{sqsClient(t)}, sourceConfig(t, q))
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
	if r := aws.ToString(attrs[sqssource.AttrReason].StringValue); r == "" || !strings.HasPrefix(reason.Error(), strings.TrimSuffix(r, "…")) {
		t.Errorf("reason attribute %q is not a prefix of the reason", r)
	}
	t.Logf("dead letter kept attributes %v; reason cut to %d bytes", keys(attrs), len(aws.ToString(attrs[sqssource.AttrReason].StringValue)))
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
