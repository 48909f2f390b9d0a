package sqsoutbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/sqsoutbox"
)

// batchClient answers SendMessageBatch with a scripted outcome per entry:
// entry 0 succeeds, 1 fails by the sender's fault, 2 by SQS's, and 3 is
// in neither list.
type batchClient struct{ sqsoutbox.Client }

func (batchClient) SendMessageBatch(_ context.Context, in *sqs.SendMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	id := func(j int) *string { return in.Entries[j].Id }
	return &sqs.SendMessageBatchOutput{
		Successful: []types.SendMessageBatchResultEntry{{Id: id(0)}},
		Failed: []types.BatchResultErrorEntry{
			{Id: id(1), Code: aws.String("InvalidMessageContents"), SenderFault: true},
			{Id: id(2), Code: aws.String("InternalError")},
			{Id: aws.String("unknown"), Code: aws.String("InternalError")},
		},
	}, nil
}

// Each message of a batch gets its own outcome: sent, a counted failure,
// an outage (SQS's own failure) or not confirmed (a counted failure).
func TestBatchOutcomes(t *testing.T) {
	p, err := sqsoutbox.New(batchClient{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]outbox.Message, 4)
	for i := range msgs {
		msgs[i] = outbox.Message{ID: string(rune('a' + i)), Destination: "http://sqs/q"}
	}
	var be *outbox.BatchError
	if err := p.Publish(context.Background(), msgs); !errors.As(err, &be) || len(be.Errs) != 4 {
		t.Fatalf("Publish = %v, want a *BatchError of 4", err)
	}
	if be.Errs[0] != nil || be.Errs[1] == nil || errors.Is(be.Errs[1], outbox.ErrUnavailable) ||
		!errors.Is(be.Errs[2], outbox.ErrUnavailable) || be.Errs[3] == nil || errors.Is(be.Errs[3], outbox.ErrUnavailable) {
		t.Fatalf("outcomes %v; want sent, failed, unavailable, not confirmed", be.Errs)
	}
}
