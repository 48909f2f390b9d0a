// Package sqsdlq is the dlq.Broker of an SQS dead-letter queue (sqssource's
// Config.DeadLetterQueueURL, or a queue's redrive-policy dead-letter queue).
//
// A scan hides the dead letters it receives for Config.ScanVisibility and
// makes the ones it did not remove visible again when it ends, stopped by
// an error or a cancelled ctx included. A replay deletes a
// dead letter only after SendMessage to its origin succeeded; if the
// process dies between the two, the next replay sends it again, which the
// runner absorbs as a duplicate of its key: the copy carries the key
// recorded for the original in consumer.MetaKey (unless Config.KeyAttribute
// holds it), which sqssource reads, since the copy's MessageId, and on FIFO
// queues its MessageDeduplicationId (the dead letter's MessageId), are new.
// A dead letter whose key was not recorded (a redrive policy moved it from a
// standard queue keyed on the MessageId) is replayed with a new key.
// docs/operations.md describes replays and the message-move task.
package sqsdlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/sources/internal/brokerkit"
	"github.com/idemq/idemq/sources/sqssource"
)

// ErrNativeUnsupported reports that MoveAll cannot replay the dead-letter
// queue: the endpoint has no message-move tasks (StartMessageMoveTask), or
// the task could send dead letters to a queue they did not come from
// (ErrNativeUnsafe). Use Scan (dlq.Replay) instead, which sends each dead
// letter to its own origin.
var ErrNativeUnsupported = errors.New("sqsdlq: no message-move task for this dead-letter queue")

// ErrNativeUnsafe reports a dead-letter queue whose dead letters may come
// from more than one queue, or from another queue than the destination
// asked for: a message-move task sends every message it finds, those that
// arrive while it runs included, to one destination. It wraps
// ErrNativeUnsupported.
var ErrNativeUnsafe = fmt.Errorf("%w: the dead letters may come from another queue than the destination", ErrNativeUnsupported)

// Config configures a Broker.
type Config struct {
	// Client is the SQS client (sqssource.NewClient). Required.
	Client *sqs.Client
	// QueueURL is the dead-letter queue's URL. Required.
	QueueURL string
	// OriginQueueURL is where dead letters without the
	// sqssource.MetaOriginQueue attribute are replayed: those SQS moved by
	// a redrive policy. Defaults to "" (they are kept, dlq.ErrNoOrigin).
	OriginQueueURL string
	// KeyAttribute is the message attribute holding the deduplication key
	// (sqssource.Config.KeyAttribute). Defaults to "": the key shown is
	// consumer.MetaKey, else the FIFO deduplication id, else the original
	// MessageId.
	KeyAttribute string
	// ScanVisibility is how long a scan hides the dead letters it received.
	// Defaults to 60 s.
	ScanVisibility time.Duration
}

// Broker reads and replays one SQS dead-letter queue. It is not safe for
// concurrent use.
type Broker struct {
	cfg Config
}

var _ dlq.Broker = (*Broker)(nil)

// New returns a Broker of cfg.QueueURL.
func New(cfg Config) (*Broker, error) {
	l := cfgerr.List{Prefix: "sqsdlq.Config."}
	if cfgerr.IsNil(cfg.Client) {
		l.Add("Client", "required")
	}
	if cfg.QueueURL == "" {
		l.Add("QueueURL", "required")
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	if cfg.ScanVisibility <= 0 {
		cfg.ScanVisibility = time.Minute
	}
	return &Broker{cfg: cfg}, nil
}

// Close does nothing: the client belongs to the caller.
func (b *Broker) Close() error { return nil }

// metaAttrs are the attributes sqssource.DeadLetter adds.
var metaAttrs = []string{consumer.MetaReason, consumer.MetaAttempts, sqssource.MetaOriginQueue, sqssource.MetaOriginMessageID,
	consumer.MetaKey, consumer.MetaDeadLetteredAt}

// Scan implements dlq.Broker, in the order SQS returns the dead letters
// (oldest first on FIFO queues, roughly so on standard ones). It ends when
// a receive returns nothing, or only dead letters it saw already (a scan
// longer than Config.ScanVisibility comes round to them again).
func (b *Broker) Scan(ctx context.Context, visit func(*dlq.Letter) dlq.Action) (done int, err error) {
	var kept []types.ChangeMessageVisibilityBatchRequestEntry
	keep := func(ms ...types.Message) {
		for _, m := range ms {
			kept = append(kept, types.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String(strconv.Itoa(len(kept))), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0})
		}
	}
	defer func() {
		if rerr := b.release(context.WithoutCancel(ctx), kept); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	seen := map[string]bool{}
	vis := int32(b.cfg.ScanVisibility / time.Second)
	for {
		out, err := b.cfg.Client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(b.cfg.QueueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: vis,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			return done, fmt.Errorf("sqsdlq: receive from %s: %w", b.cfg.QueueURL, err)
		}
		if len(out.Messages) == 0 {
			return done, nil
		}
		// Only dead letters seen already: the scan took longer than
		// ScanVisibility and came round to them again.
		wrapped := true
		for _, m := range out.Messages {
			wrapped = wrapped && seen[aws.ToString(m.MessageId)]
		}
		// A failed replay or delete (a cancelled ctx included) keeps the
		// rest of the batch too, so that release shows it again at once.
		for i, m := range out.Messages {
			id := aws.ToString(m.MessageId)
			if seen[id] {
				keep(m)
				continue
			}
			seen[id] = true
			l := b.letterOf(m)
			act := visit(l)
			switch act {
			case dlq.ActionReplay:
				if err := b.replay(ctx, m, l); err != nil {
					keep(out.Messages[i:]...)
					return done, err
				}
				fallthrough
			case dlq.ActionPurge:
				if _, err := b.cfg.Client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(b.cfg.QueueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
					keep(out.Messages[i:]...)
					return done, fmt.Errorf("sqsdlq: delete dead letter %s (a replayed copy is sent again by the next replay): %w", id, err)
				}
				done++
			case dlq.ActionStop:
				keep(out.Messages[i:]...)
				return done, nil
			default:
				keep(m)
			}
		}
		if wrapped {
			return done, nil
		}
	}
}

// releaseTimeout bounds each request of release, which runs after the
// scan's ctx may have been cancelled.
const releaseTimeout = 10 * time.Second

// release makes the kept dead letters visible again. It stops at the first
// request that times out: the endpoint does not answer, and the dead
// letters left reappear after Config.ScanVisibility.
func (b *Broker) release(ctx context.Context, kept []types.ChangeMessageVisibilityBatchRequestEntry) error {
	var errs []error
	for chunk := range slices.Chunk(kept, sqssource.MaxBatch) {
		rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		out, err := b.cfg.Client.ChangeMessageVisibilityBatch(rctx, &sqs.ChangeMessageVisibilityBatchInput{
			QueueUrl: aws.String(b.cfg.QueueURL), Entries: chunk})
		cancel()
		if err != nil {
			errs = append(errs, err)
			if errors.Is(err, context.DeadlineExceeded) {
				break
			}
		} else if len(out.Failed) > 0 {
			errs = append(errs, fmt.Errorf("%d entries failed, the first: %s", len(out.Failed), aws.ToString(out.Failed[0].Message)))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("sqsdlq: make the kept dead letters visible again (they reappear after %s): %w", b.cfg.ScanVisibility, errors.Join(errs...))
	}
	return nil
}

// replay sends the copy of m to its origin.
func (b *Broker) replay(ctx context.Context, m types.Message, l *dlq.Letter) error {
	attrs := map[string]types.MessageAttributeValue{}
	for name, v := range m.MessageAttributes {
		if !slices.Contains(metaAttrs, name) {
			attrs[name] = types.MessageAttributeValue{DataType: v.DataType, StringValue: v.StringValue, BinaryValue: v.BinaryValue}
		}
	}
	if l.Key != "" && (b.cfg.KeyAttribute == "" || aws.ToString(attrs[b.cfg.KeyAttribute].StringValue) != l.Key) {
		if len(attrs) >= sqssource.MaxMessageAttributes {
			return fmt.Errorf("sqsdlq: replay %s to %s (the dead letter stays): its %d message attributes leave no room for the key attribute %s",
				l.ID, l.Origin, len(attrs), consumer.MetaKey)
		}
		attrs[consumer.MetaKey] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(l.Key)}
	}
	in := &sqs.SendMessageInput{QueueUrl: aws.String(l.Origin), MessageBody: m.Body, MessageAttributes: attrs}
	if strings.HasSuffix(l.Origin, ".fifo") {
		in.MessageGroupId = aws.String(cmp.Or(m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)], "idemq-replay"))
		// Unique per dead letter, not the key: SQS drops a replay run again
		// within its deduplication interval, but never takes the copy for
		// the original (sent with the key less than 5 minutes before, the
		// copy would be dropped and lost).
		in.MessageDeduplicationId = m.MessageId
	}
	if _, err := b.cfg.Client.SendMessage(ctx, in); err != nil {
		return fmt.Errorf("sqsdlq: replay %s to %s (the dead letter stays): %w", l.ID, l.Origin, err)
	}
	return nil
}

// letterOf describes m.
func (b *Broker) letterOf(m types.Message) *dlq.Letter {
	attr := func(name string) string {
		if v, ok := m.MessageAttributes[name]; ok {
			return aws.ToString(v.StringValue)
		}
		return ""
	}
	l := brokerkit.Letter(aws.ToString(m.MessageId), []byte(aws.ToString(m.Body)), attr)
	l.Origin = cmp.Or(attr(sqssource.MetaOriginQueue), b.cfg.OriginQueueURL)
	// l.Key is consumer.MetaKey's. SQS names no attribute "".
	l.Key = cmp.Or(attr(b.cfg.KeyAttribute), l.Key, m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)],
		attr(sqssource.MetaOriginMessageID))
	if ms, err := strconv.ParseInt(m.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil && l.DeadLetteredAt.IsZero() {
		l.DeadLetteredAt = time.UnixMilli(ms).UTC()
	}
	for name, v := range m.MessageAttributes {
		if !slices.Contains(metaAttrs, name) && v.StringValue != nil {
			l.Headers[name] = *v.StringValue
		}
	}
	return l
}

// MoveAll replays the whole dead-letter queue with SQS's native
// message-move task, to its one source queue, and waits for the task to
// finish, calling progress with the number moved so far. It returns the
// number of messages moved.
//
// The task moves every message of the queue, those that arrive while it
// runs included, to one destination, so MoveAll uses it only when every
// dead letter comes from one queue: the dead-letter queue's
// RedriveAllowPolicy allows exactly one source queue (byQueue), no other
// queue names it in a redrive policy (ListDeadLetterSourceQueues), and
// destinationURL, when it is not "", is that queue. Otherwise it moves
// nothing and returns an error wrapping ErrNativeUnsafe (always so with
// SQS's default allowAll, and on ElasticMQ); an endpoint without
// message-move tasks gives one wrapping ErrNativeUnsupported. Scan
// (dlq.Replay) replays those. The moved messages keep every attribute,
// idemq's dead-letter metadata included (the runner ignores it).
func (b *Broker) MoveAll(ctx context.Context, destinationURL string, progress func(moved int)) (int, error) {
	attrs, err := b.attributes(ctx, b.cfg.QueueURL, types.QueueAttributeNameQueueArn, types.QueueAttributeNameRedriveAllowPolicy)
	if err != nil {
		return 0, err
	}
	src := attrs[string(types.QueueAttributeNameQueueArn)]
	var sources []string
	for p := sqs.NewListDeadLetterSourceQueuesPaginator(b.cfg.Client, &sqs.ListDeadLetterSourceQueuesInput{QueueUrl: aws.String(b.cfg.QueueURL)}); p.HasMorePages(); {
		out, err := p.NextPage(ctx)
		if err != nil {
			return 0, nativeErr(err, "the queues that name "+b.cfg.QueueURL+" as their dead-letter queue")
		}
		for _, u := range out.QueueUrls {
			arn, err := b.arn(ctx, u)
			if err != nil {
				return 0, err
			}
			sources = append(sources, arn)
		}
	}
	var requested string
	if destinationURL != "" {
		if requested, err = b.arn(ctx, destinationURL); err != nil {
			return 0, err
		}
	}
	dst, err := moveDestination(attrs[string(types.QueueAttributeNameRedriveAllowPolicy)], sources, requested)
	if err != nil {
		return 0, err
	}
	out, err := b.cfg.Client.StartMessageMoveTask(ctx, &sqs.StartMessageMoveTaskInput{SourceArn: aws.String(src), DestinationArn: aws.String(dst)})
	if err != nil {
		return 0, nativeErr(err, "start the message-move task")
	}
	for {
		lt, err := b.cfg.Client.ListMessageMoveTasks(ctx, &sqs.ListMessageMoveTasksInput{SourceArn: aws.String(src), MaxResults: aws.Int32(10)})
		if err != nil {
			return 0, fmt.Errorf("sqsdlq: message-move task %s: %w", aws.ToString(out.TaskHandle), err)
		}
		for _, t := range lt.Results {
			if aws.ToString(t.TaskHandle) != aws.ToString(out.TaskHandle) && len(lt.Results) > 1 {
				continue
			}
			moved := int(t.ApproximateNumberOfMessagesMoved)
			if progress != nil {
				progress(moved)
			}
			switch aws.ToString(t.Status) {
			case "COMPLETED":
				return moved, nil
			case "FAILED", "CANCELLED":
				return moved, fmt.Errorf("sqsdlq: message-move task %s: %s", aws.ToString(t.Status), aws.ToString(t.FailureReason))
			}
			break
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// moveDestination returns the ARN of the one queue that can feed a
// dead-letter queue whose RedriveAllowPolicy attribute is policy and which
// the queues sources (ARNs) name in their redrive policies, where a
// message-move task may send all of it; requested, when it is not "", must
// be that queue. Any doubt is an error wrapping ErrNativeUnsafe.
func moveDestination(policy string, sources []string, requested string) (string, error) {
	p, err := sqssource.ParseRedriveAllowPolicy(policy)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNativeUnsafe, err)
	}
	switch {
	case p.Permission == sqssource.RedrivePermissionAllowAll:
		return "", fmt.Errorf("%w: its RedriveAllowPolicy allows any queue as a source (allowAll, the default)", ErrNativeUnsafe)
	case p.Permission != sqssource.RedrivePermissionByQueue || len(p.SourceQueueARNs) != 1:
		return "", fmt.Errorf("%w: its RedriveAllowPolicy (%s) does not name exactly one source queue", ErrNativeUnsafe, policy)
	}
	only := p.SourceQueueARNs[0]
	for _, s := range sources {
		if s != only {
			return "", fmt.Errorf("%w: %s names it as its dead-letter queue, but its RedriveAllowPolicy allows only %s", ErrNativeUnsafe, s, only)
		}
	}
	if requested != "" && requested != only {
		return "", fmt.Errorf("%w: its only source queue is %s, not %s", ErrNativeUnsafe, only, requested)
	}
	return only, nil
}

// attributes reads attributes of the queue at url.
func (b *Broker) attributes(ctx context.Context, url string, names ...types.QueueAttributeName) (map[string]string, error) {
	out, err := b.cfg.Client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: names})
	if err != nil {
		return nil, fmt.Errorf("sqsdlq: attributes of %s: %w", url, err)
	}
	return out.Attributes, nil
}

func (b *Broker) arn(ctx context.Context, url string) (string, error) {
	attrs, err := b.attributes(ctx, url, types.QueueAttributeNameQueueArn)
	if err != nil {
		return "", err
	}
	return attrs[string(types.QueueAttributeNameQueueArn)], nil
}

// nativeErr wraps err, the error of a call to what, in ErrNativeUnsupported
// when it says that the endpoint lacks the operation.
func nativeErr(err error, what string) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		c, msg := ae.ErrorCode(), strings.ToLower(ae.ErrorMessage())
		if c == "UnsupportedOperation" || c == "InvalidAction" || strings.Contains(c, "Unknown") || strings.Contains(c, "NotImplemented") ||
			strings.Contains(msg, "not supported") || strings.Contains(msg, "unknown") {
			return fmt.Errorf("%w: %w", ErrNativeUnsupported, err)
		}
	}
	return fmt.Errorf("sqsdlq: %s: %w", what, err)
}
