// Package sqsoutbox is the SQS Publisher of an outbox.Relay, on
// aws-sdk-go-v2.
//
// Rows are sent with SendMessageBatch, up to 10 per call, to the queue
// named by their Destination (a queue URL, or a queue name resolved once
// with GetQueueUrl). Each message carries the stable id in the string
// attribute "idempotency-key" (outbox.HeaderIdempotencyKey) and its headers
// as string attributes (SQS allows 10 attributes, so at most 8 headers).
// On a standard queue the partition key travels in the "partition-key"
// attribute (outbox.HeaderPartitionKey); on a FIFO queue (URL ending in
// .fifo) it is the MessageGroupId ("default" when empty) and the
// MessageDeduplicationId is a hash of the stable id, so SQS itself drops
// re-sends within its 5-minute window. Bodies are sent as strings: SQS
// refuses characters outside its allowed set (binary data), and such a row
// is parked after MaxAttempts; encode binary bodies (base64) before
// Publish.
//
// A downstream sqssource consumer deduplicates the relay's re-sends when
// its Config.KeyAttribute is "idempotency-key" (sqssource has no default
// key attribute); set PartitionKeyAttribute to "partition-key" to keep one
// key's messages in one lane on standard queues.
package sqsoutbox

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/metatext"
	"github.com/idemq/idemq/sinks/outbox"
)

// Client is the part of *sqs.Client the Publisher uses.
type Client interface {
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
	GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, opts ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error)
}

// maxBatch is SendMessageBatch's limit on entries.
const maxBatch = 10

// maxAttributes is SQS's limit on message attributes.
const maxAttributes = 10

// Publisher publishes outbox rows to SQS. It is safe for concurrent use.
type Publisher struct {
	c    Client
	urls sync.Map // queue name -> URL
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a Publisher over c.
func New(c Client) (*Publisher, error) {
	if c == nil {
		return nil, &idemq.ConfigError{Field: "sqsoutbox.New(c)", Reason: "required"}
	}
	return &Publisher{c: c}, nil
}

// Publish sends msgs and returns once SQS accepted every one of them (nil)
// or with an *outbox.BatchError.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) error {
	return outbox.PublishByDestination(msgs, func(group []outbox.Message) error {
		url, err := p.queueURL(ctx, group[0].Destination)
		if err != nil {
			return err
		}
		// Batches go out one after another, so a FIFO group keeps its order.
		errs := make([]error, len(group))
		for start := 0; start < len(group); start += maxBatch {
			end := min(start+maxBatch, len(group))
			p.send(ctx, url, group[start:end], errs[start:end])
		}
		return outbox.BatchResult(errs)
	})
}

// send sends msgs to url in one SendMessageBatch call and sets errs[i] to
// the outcome of msgs[i].
func (p *Publisher) send(ctx context.Context, url string, msgs []outbox.Message, errs []error) {
	fifo := strings.HasSuffix(url, ".fifo")
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(url)}
	unconfirmed := make(map[string]int, len(msgs)) // entry id -> index in msgs
	for i, m := range msgs {
		e, err := entry(m, strconv.Itoa(i), fifo)
		if err != nil {
			errs[i] = err
			continue
		}
		in.Entries = append(in.Entries, e)
		unconfirmed[*e.Id] = i
	}
	if len(in.Entries) == 0 {
		return
	}
	out, err := p.c.SendMessageBatch(ctx, in)
	if err != nil {
		err = classify(err)
		for _, i := range unconfirmed {
			errs[i] = err
		}
		return
	}
	for _, f := range out.Failed {
		if i, ok := unconfirmed[aws.ToString(f.Id)]; ok {
			errs[i] = fmt.Errorf("sqsoutbox: %s: %s", aws.ToString(f.Code), aws.ToString(f.Message))
			if !f.SenderFault {
				errs[i] = outbox.Unavailable(errs[i]) // SQS's own failure: retry without counting
			}
			delete(unconfirmed, aws.ToString(f.Id))
		}
	}
	for _, s := range out.Successful {
		delete(unconfirmed, aws.ToString(s.Id))
	}
	// An entry neither in Successful nor in Failed was not confirmed.
	for _, i := range unconfirmed {
		errs[i] = errors.New("sqsoutbox: SQS did not confirm the message")
	}
}

// entry converts a row to a batch entry.
func entry(m outbox.Message, id string, fifo bool) (types.SendMessageBatchRequestEntry, error) {
	attrs := map[string]types.MessageAttributeValue{
		outbox.HeaderIdempotencyKey: stringAttr(m.ID),
	}
	e := types.SendMessageBatchRequestEntry{Id: aws.String(id), MessageBody: aws.String(string(m.Body))}
	if fifo {
		sum := sha256.Sum256([]byte(m.ID))
		e.MessageGroupId = aws.String(cmp.Or(m.Key, "default"))
		e.MessageDeduplicationId = aws.String(hex.EncodeToString(sum[:]))
	} else if m.Key != "" {
		attrs[outbox.HeaderPartitionKey] = stringAttr(m.Key)
	}
	for k, v := range m.Headers {
		if _, taken := attrs[k]; !taken {
			attrs[k] = stringAttr(v)
		}
	}
	if len(attrs) > maxAttributes {
		return e, fmt.Errorf("sqsoutbox: message %s has %d attributes with its headers, SQS allows %d", m.ID, len(attrs), maxAttributes)
	}
	e.MessageAttributes = attrs
	return e, nil
}

// stringAttr is a String message attribute holding v. SQS refuses a value
// with characters outside the XML 1.0 range (control characters, invalid
// UTF-8) and would fail the row on every attempt, so such characters are
// written as Go escapes them ("\x01"); valid values pass unchanged.
func stringAttr(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(metatext.Clean(v, 0))}
}

// queueURL returns the URL of dest, a URL or a queue name.
func (p *Publisher) queueURL(ctx context.Context, dest string) (string, error) {
	if strings.Contains(dest, "://") {
		return dest, nil
	}
	if url, ok := p.urls.Load(dest); ok {
		return url.(string), nil
	}
	out, err := p.c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(dest)})
	if err != nil {
		return "", classify(err)
	}
	url := aws.ToString(out.QueueUrl)
	p.urls.Store(dest, url)
	return url, nil
}

// classify marks err as an outage or a missing queue.
func classify(err error) error {
	var qne *types.QueueDoesNotExist
	var api smithy.APIError
	switch {
	case errors.As(err, &qne):
		return outbox.NoDestination(err)
	case errors.As(err, &api) && (strings.Contains(api.ErrorCode(), "NonExistentQueue") || strings.Contains(api.ErrorCode(), "QueueDoesNotExist")):
		return outbox.NoDestination(err)
	case errors.As(err, &api) && api.ErrorFault() == smithy.FaultServer:
		return outbox.Unavailable(err)
	case outbox.IsConnectionError(err):
		return outbox.Unavailable(err)
	}
	return err
}
