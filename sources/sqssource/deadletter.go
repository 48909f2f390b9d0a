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
// Config.DeadLetterQueueURL, beside consumer.MetaReason (at most 2 KiB of
// the error's text, characters SQS refuses written as Go escapes),
// consumer.MetaAttempts (a Number attribute) and consumer.MetaKey (the key
// the runner recorded, unless the Config.KeyAttribute attribute holds it),
// which Receive reads as the key of a replayed copy (sqsdlq).
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
// message attributes plus those above; on FIFO queues the same
// MessageGroupId and the original MessageId as MessageDeduplicationId), and
// deletes the original only after the send succeeded. Until both succeeded
// the original stays in flight (its visibility extended and, on a FIFO
// queue, its group blocked). If either fails, DeadLetter returns the error
// and hands the original back like a retry, visible after
// Config.RedriveDelay; if the delete failed, it is then dead-lettered
// again, and the dead-letter queue holds two copies (a FIFO dead-letter
// queue drops the second within its 5-minute deduplication interval).
//
// The copy must fit in SQS's 10 message attributes and in the dead-letter
// queue's MaximumMessageSize (read at New), body and attributes together.
// The configured KeyAttribute is kept first, then the original's other
// attributes in name order; to fit the size, the original's attributes are
// dropped (largest first) before the reason is cut below 256 bytes, then
// the source's own before it is cut below 64 bytes, then the reason is cut
// to what is left. What was dropped or cut is logged at WARN. A body larger
// than the limit goes to the queue's redrive policy if it has one (logged
// at ERROR), else DeadLetter fails and the original comes back after
// Config.RedriveDelay.
//
// Without Config.DeadLetterQueueURL, the queue's redrive policy does the
// work: DeadLetter logs the reason and makes the message visible again
// after Config.RedriveDelay, and SQS moves it to the policy's dead-letter
// queue once it has been received maxReceiveCount times (docs/sources.md
// says how often it is handled meanwhile). A handler that fails does not
// commit, so this repeats no effect.
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
		if err := s.setVisibility(ctx, h, h.within(s.cfg.RedriveDelay)); err != nil {
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
		in.MessageGroupId = aws.String(cmp.Or(msg.PartitionKey, fifoDeadLetterGroup))
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

// within bounds a visibility delay of h to what is left of its 12-hour
// visibility limit; a negative d is 0.
func (h *handle) within(d time.Duration) time.Duration {
	return min(max(d, 0), MaxVisibility-time.Since(h.receivedAt)-time.Second)
}

// handBack hands h back to the queue after a failed dead-letter attempt: it
// becomes visible after Config.RedriveDelay, and in strict FIFO order the
// later messages of its group go back to follow it. A failure is logged: h
// then comes back when its current visibility timeout ends.
func (s *Source) handBack(ctx context.Context, h *handle) {
	if err := s.setVisibility(ctx, h, h.within(s.cfg.RedriveDelay)); err != nil {
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

// MaxMessageSize is the largest message SQS accepts, in bytes: the body plus
// every message attribute's name, data type and value (256 KiB). A queue's
// MaximumMessageSize attribute may set a lower limit.
const MaxMessageSize = 262144

// attributeSize is what SQS counts for one message attribute: its name, data
// type and value.
func attributeSize(name string, v types.MessageAttributeValue) int {
	return len(name) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
}

// messageSize is what SQS counts for a message: the body and the attributes.
func messageSize(body string, attrs map[string]types.MessageAttributeValue) int {
	n := len(body)
	for name, v := range attrs {
		n += attributeSize(name, v)
	}
	return n
}

// fitDeadLetter shrinks attrs, the attributes of a dead-letter copy of body,
// until the copy fits in limit bytes. It drops the original's attributes
// (largest first) while the reason would be cut below 256 bytes, then the
// key attribute, MetaOriginQueue, MetaOriginMessageID, consumer.MetaAttempts
// and consumer.MetaKey while it would be cut below 64 bytes, then cuts the
// reason to what is left (dropping it if not one byte is). It returns the names it dropped and whether the reason
// was cut, and false if not even the body alone fits.
func fitDeadLetter(body string, attrs map[string]types.MessageAttributeValue, keyAttr string, limit int) (dropped []string, cut, ok bool) {
	if messageSize(body, attrs) <= limit {
		return nil, false, true
	}
	reason, hasReason := attrs[consumer.MetaReason]
	text := aws.ToString(reason.StringValue)
	delete(attrs, consumer.MetaReason)
	reasonOverhead := 0
	if hasReason {
		reasonOverhead = attributeSize(consumer.MetaReason, types.MessageAttributeValue{DataType: reason.DataType})
	}
	// room is what is left for the reason's text.
	room := func() int { return limit - messageSize(body, attrs) - reasonOverhead }
	drop := func(floor int, names []string) {
		for _, name := range names {
			if room() >= min(len(text), floor) {
				return
			}
			if _, has := attrs[name]; has {
				delete(attrs, name)
				dropped = append(dropped, name)
			}
		}
	}

	var theirs []string
	for name := range attrs {
		switch name {
		case consumer.MetaAttempts, MetaOriginQueue, MetaOriginMessageID, consumer.MetaKey, keyAttr:
		default:
			theirs = append(theirs, name)
		}
	}
	slices.SortFunc(theirs, func(a, b string) int {
		return cmp.Or(cmp.Compare(attributeSize(b, attrs[b]), attributeSize(a, attrs[a])), cmp.Compare(a, b))
	})
	drop(256, theirs)
	drop(64, []string{keyAttr, MetaOriginQueue, MetaOriginMessageID, consumer.MetaAttempts, consumer.MetaKey})
	drop(1, theirs) // when there is no reason to keep

	if hasReason {
		switch n := room(); {
		case n >= len(text):
			attrs[consumer.MetaReason] = reason
		case n >= 1: // SQS refuses an empty String attribute
			attrs[consumer.MetaReason] = types.MessageAttributeValue{DataType: reason.DataType, StringValue: aws.String(metatext.Cut(text, n))}
			cut = true
		default:
			dropped = append(dropped, consumer.MetaReason)
		}
	}
	return dropped, cut, messageSize(body, attrs) <= limit
}

// parseMaximumMessageSize reads a queue's MaximumMessageSize attribute; an
// absent or unreadable one is MaxMessageSize.
func parseMaximumMessageSize(v string) int {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxMessageSize {
		return MaxMessageSize
	}
	return n
}
