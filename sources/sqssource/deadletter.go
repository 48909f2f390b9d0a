package sqssource

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/metatext"
	"github.com/idemq/idemq/sources/internal/brokerkit"
)

// Message attributes that DeadLetter adds to the copy it sends to
// Config.DeadLetterQueueURL: consumer.MetaReason, the error that sent the
// message there (at most 2 KiB of its text, a longer one cut and ending with
// " ...(truncated)"; characters SQS refuses in an attribute (control
// characters, invalid UTF-8, U+FFFE, U+FFFF) are written as Go escapes
// (\x01)), consumer.MetaAttempts, the number of attempts made (a Number
// attribute), consumer.MetaKey, the key the runner recorded (unless the
// Config.KeyAttribute attribute holds it already), and the SQS fields below.
//
// A replayed copy (sqsdlq) carries consumer.MetaKey, which Receive reads as
// the key of a message without the Config.KeyAttribute attribute: the copy's
// MessageId, and on FIFO queues its MessageDeduplicationId, are new, but its
// key is the one recorded for the original.
const (
	// MetaOriginQueue holds the URL of the queue the message came from.
	MetaOriginQueue = "idemq-source-queue"
	// MetaOriginMessageID holds the MessageId of the original message.
	MetaOriginMessageID = "idemq-message-id"
)

// maxReasonBytes bounds the reason text stored in consumer.MetaReason.
const maxReasonBytes = 2048

// MaxMessageAttributes is the number of message attributes SQS accepts on
// one message.
const MaxMessageAttributes = 10

// fifoDeadLetterGroup is the MessageGroupId of dead letters whose original had
// none (it cannot happen on a FIFO queue, but SendMessage requires one).
const fifoDeadLetterGroup = "idemq-dead-letters"

// DeadLetter routes msg to the dead-letter queue.
//
// With Config.DeadLetterQueueURL it sends a copy there (same body, its
// message attributes, plus consumer.MetaReason, consumer.MetaAttempts,
// MetaOriginQueue, MetaOriginMessageID and consumer.MetaKey; on FIFO queues the same MessageGroupId and the original
// MessageId as MessageDeduplicationId), and deletes the original only after
// the send succeeded. Until both succeeded the original stays in flight (its
// visibility extended and, on a FIFO queue, its group blocked). If either
// fails, the original is made visible again after Config.RedriveDelay, like
// a retry (in strict FIFO order the later messages of its group that were
// already received go back to the queue to follow it), and DeadLetter
// returns the error. If the delete failed, the original is then delivered
// and dead-lettered again, and the dead-letter queue holds two copies (a FIFO
// dead-letter queue drops the second within its 5-minute deduplication
// interval). SQS allows 10 message attributes: if the original has more than
// fit beside the five above, the configured KeyAttribute is kept first, then
// the others in name order, and the rest is dropped (and logged).
//
// The copy must fit in the dead-letter queue's MaximumMessageSize (read at
// New; 256 KiB at most), body and attributes together, so a message near the
// limit would otherwise never be dead-lettered. The copy is cut to fit: the
// original's attributes are dropped (largest first) before the reason is cut
// below 256 bytes, then the key attribute, queue, message id, attempts and
// consumer.MetaKey before it is cut below 64 bytes, then the reason is cut to what is left
// (a maximum-size message keeps only as many bytes of reason as its own
// attributes took). What was cut is logged at WARN; the Runner logs the full
// reason. A body larger than the dead-letter queue's limit goes to the
// queue's redrive policy if it has one (logged at ERROR), else DeadLetter
// fails and the original comes back after Config.RedriveDelay.
//
// Without it, the queue's redrive policy does the work: DeadLetter makes the
// message visible again after Config.RedriveDelay, and SQS moves it to the
// policy's dead-letter queue once it has been received maxReceiveCount times.
// Until then it is received and handled again after each RedriveDelay, up to
// the runner's MaxAttempts times with its retry backoff when the runner's
// store counts handler failures (the count starts afresh after each
// hand-over; see the package documentation, "Attempts"). A handler that
// fails does not commit, so this repeats no effect. The reason is logged,
// not stored.
func (s *Source) DeadLetter(ctx context.Context, msg *consumer.Message, reason error) error {
	if s.isClosed() {
		return consumer.ErrClosed
	}
	h, err := s.handleOf(msg)
	if err != nil {
		return err
	}
	attempts, key := brokerkit.Recorded(reason, msg.Attempt, msg.Key)
	if attempts <= 0 {
		attempts = msg.Attempt
	}
	var attrs map[string]types.MessageAttributeValue
	if s.cfg.DeadLetterQueueURL != "" {
		attrs = s.deadLetterAttributes(ctx, h, reason, attempts, key)
		dropped, cut, fits := fitDeadLetter(aws.ToString(h.raw.Body), attrs, s.cfg.KeyAttribute, s.deadLetterLimit)
		switch {
		case !fits && s.maxReceiveCount > 0:
			s.log.ErrorContext(ctx, "message is larger than the dead-letter queue's MaximumMessageSize; left to the queue's redrive policy",
				consumer.LogKeyID, h.id, "size", len(aws.ToString(h.raw.Body)), "limit", s.deadLetterLimit)
			attrs = nil
		case !fits:
			s.handBack(ctx, h)
			return fmt.Errorf("sqssource: dead letter %s: its body (%d bytes) is larger than the dead-letter queue's MaximumMessageSize (%d) and the queue has no redrive policy (the original stays and comes back)",
				h.id, len(aws.ToString(h.raw.Body)), s.deadLetterLimit)
		case cut || len(dropped) > 0:
			s.log.WarnContext(ctx, "dead letter cut to the dead-letter queue's maximum message size", consumer.LogKeyID, h.id,
				"reason_cut", cut, "dropped", dropped, "limit", s.deadLetterLimit)
		}
	}
	if attrs == nil {
		s.log.WarnContext(ctx, "message left to the queue's redrive policy", consumer.LogKeyID, h.id,
			consumer.LogKeyAttempt, attempts, "max_receive_count", s.maxReceiveCount, consumer.LogKeyError, reason)
		if err := s.setVisibility(ctx, h, s.redriveDelay(h)); err != nil {
			return fmt.Errorf("sqssource: dead letter %s through the redrive policy: %w", h.id, err)
		}
		s.stats.deadLettered.Add(1)
		return nil
	}

	// h stays tracked until the original is deleted: the heartbeat keeps it
	// hidden and, in strict FIFO order, its group waits for it.
	in := &sqs.SendMessageInput{
		QueueUrl:          aws.String(s.cfg.DeadLetterQueueURL),
		MessageBody:       h.raw.Body,
		MessageAttributes: attrs,
	}
	if s.fifo {
		group := msg.PartitionKey
		if group == "" {
			group = fifoDeadLetterGroup
		}
		in.MessageGroupId = aws.String(group)
		in.MessageDeduplicationId = aws.String(h.id)
	}
	sctx, cancel := s.requestContext(ctx)
	_, err = s.client.SendMessage(sctx, in)
	cancel()
	if err != nil {
		s.handBack(ctx, h)
		return fmt.Errorf("sqssource: dead letter %s: send to the dead-letter queue (the original stays and comes back): %w", h.id, err)
	}
	if failed, err := s.deleteBatch(ctx, []*handle{h}); len(failed) > 0 {
		s.stats.deleteFailures.Add(1)
		s.handBack(ctx, h)
		return fmt.Errorf("sqssource: dead letter %s was written, but deleting the original failed (it comes back and is dead-lettered again): %w",
			h.id, &BatchError{Op: "DeleteMessageBatch", Entries: failed, Err: err})
	}
	s.untrack(h)
	s.stats.deadLettered.Add(1)
	return nil
}

// redriveDelay is Config.RedriveDelay, bounded by what is left of h's
// 12-hour visibility limit.
func (s *Source) redriveDelay(h *handle) time.Duration {
	return min(max(s.cfg.RedriveDelay, 0), MaxVisibility-time.Since(h.receivedAt)-time.Second)
}

// handBack hands h back to the queue after a failed dead-letter attempt: it
// becomes visible after Config.RedriveDelay, and in strict FIFO order the
// later messages of its group go back to follow it. A failure is logged: h
// then comes back when its current visibility timeout ends.
func (s *Source) handBack(ctx context.Context, h *handle) {
	if err := s.setVisibility(ctx, h, s.redriveDelay(h)); err != nil {
		s.log.WarnContext(ctx, "handing back a message that was not dead-lettered failed; it returns after its visibility timeout",
			consumer.LogKeyID, h.id, consumer.LogKeyError, err)
	}
}

// deadLetterAttributes returns the attributes of a dead letter: the reason
// attributes, the key the runner recorded (consumer.MetaKey) unless the
// original's Config.KeyAttribute holds it, and as many of the original's
// attributes as fit.
func (s *Source) deadLetterAttributes(ctx context.Context, h *handle, reason error, attempts int, key string) map[string]types.MessageAttributeValue {
	text := cmp.Or(brokerkit.ReasonText(reason, maxReasonBytes), "unknown") // SQS refuses an empty String attribute
	attrs := map[string]types.MessageAttributeValue{
		consumer.MetaReason:   {DataType: aws.String("String"), StringValue: aws.String(text)},
		consumer.MetaAttempts: {DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(attempts))},
		MetaOriginQueue:       {DataType: aws.String("String"), StringValue: aws.String(metatext.Clean(s.cfg.QueueURL, maxReasonBytes))},
		MetaOriginMessageID:   {DataType: aws.String("String"), StringValue: aws.String(metatext.Clean(h.id, maxReasonBytes))},
	}
	if key != "" && (s.cfg.KeyAttribute == "" || aws.ToString(h.raw.MessageAttributes[s.cfg.KeyAttribute].StringValue) != key) {
		attrs[consumer.MetaKey] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(metatext.Clean(key, consumer.MaxKeyBytes))}
	}
	names := make([]string, 0, len(h.raw.MessageAttributes))
	for name := range h.raw.MessageAttributes {
		if _, ours := attrs[name]; !ours {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	if i := slices.Index(names, s.cfg.KeyAttribute); i > 0 { // the key attribute first
		names = slices.Insert(slices.Delete(names, i, i+1), 0, s.cfg.KeyAttribute)
	}
	var dropped []string
	for _, name := range names {
		if len(attrs) == MaxMessageAttributes {
			dropped = append(dropped, name)
			continue
		}
		v := h.raw.MessageAttributes[name]
		attrs[name] = types.MessageAttributeValue{DataType: v.DataType, StringValue: v.StringValue, BinaryValue: v.BinaryValue}
	}
	if len(dropped) > 0 {
		s.log.WarnContext(ctx, "dead letter has too many message attributes; some were dropped", consumer.LogKeyID, h.id, "dropped", dropped)
	}
	return attrs
}
