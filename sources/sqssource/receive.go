package sqssource

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
)

// systemAttributes are the system attributes requested with every receive.
var systemAttributes = []types.MessageSystemAttributeName{
	types.MessageSystemAttributeNameApproximateReceiveCount,
	types.MessageSystemAttributeNameMessageGroupId,
	types.MessageSystemAttributeNameMessageDeduplicationId,
	types.MessageSystemAttributeNameSentTimestamp,
	types.MessageSystemAttributeNameSequenceNumber,
	types.MessageSystemAttributeNameAWSTraceHeader,
}

// Receive returns up to max received messages, waiting (long polling) until
// at least one is available, ctx is done or the Source is closed. It keeps
// up to Config.MaxReceivers ReceiveMessage calls of 10 messages in flight
// while fewer than max messages are buffered or being received (so at most
// max+9 wait ahead of the caller, their visibility extended), and starts
// the next ones before it returns, so that receiving overlaps with
// handling. The messages of a call still in flight when Receive returns
// are kept for the next Receive.
//
// Receive returns ctx's error (wrapped) when ctx is done, consumer.ErrClosed
// after Close, and the error of a failed ReceiveMessage call when no message
// is available. It deletes nothing.
func (s *Source) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	if max < 1 {
		max = 1
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("sqssource: receive: %w", err)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, consumer.ErrClosed
		}
		if out := s.take(max); len(out) > 0 {
			// Receive the next messages while the caller handles these.
			s.prefetch(max)
			s.mu.Unlock()
			return out, nil
		}
		if err := s.pollErr; err != nil {
			s.pollErr = nil
			s.mu.Unlock()
			return nil, err
		}
		s.prefetch(max)
		wake := s.wake
		s.mu.Unlock()

		select {
		case <-ctx.Done():
		case <-s.closeCtx.Done():
		case <-wake:
		}
	}
}

// prefetch starts ReceiveMessage calls for 10 messages each, at most
// Config.MaxReceivers at a time, until the messages buffered or being
// received cover max. s.mu must be held.
func (s *Source) prefetch(max int) {
	want := min((max+MaxBatch-1)/MaxBatch, s.cfg.MaxReceivers)
	for s.polls < want && len(s.ready)+s.polls*MaxBatch < max {
		s.polls++
		s.bg.Go(s.poll)
	}
}

// poll makes one ReceiveMessage call for up to 10 messages and hands its
// result to Receive.
func (s *Source) poll() {
	ctx, cancel := context.WithTimeout(s.closeCtx, s.cfg.WaitTime+s.cfg.RequestTimeout)
	defer cancel()
	in := &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(s.cfg.QueueURL),
		MaxNumberOfMessages:         MaxBatch,
		WaitTimeSeconds:             int32(s.cfg.WaitTime / time.Second),
		VisibilityTimeout:           int32(s.cfg.VisibilityTimeout / time.Second),
		MessageSystemAttributeNames: systemAttributes,
		MessageAttributeNames:       []string{"All"},
	}
	if s.fifo {
		// The SDK's retries of this call then return the same messages
		// instead of hiding others until their visibility timeout.
		in.ReceiveRequestAttemptId = aws.String(rand.Text())
	}
	start := time.Now()
	out, err := s.client.ReceiveMessage(ctx, in)

	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.broadcast()
	s.polls--
	if err != nil {
		if s.closed || errors.Is(err, context.Canceled) {
			return
		}
		s.stats.receiveFailures.Add(1)
		s.pollErr = fmt.Errorf("sqssource: receive from %s: %w", s.queueName, err)
		return
	}
	s.stats.received.Add(uint64(len(out.Messages)))
	now := time.Now()
	for _, m := range out.Messages {
		h := &handle{
			src:        s,
			raw:        m,
			receipt:    aws.ToString(m.ReceiptHandle),
			id:         aws.ToString(m.MessageId),
			group:      m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
			receivedAt: start,
			extendedAt: start,
		}
		s.inflight[h] = struct{}{}
		s.ready = append(s.ready, s.message(h, now))
	}
}

// broadcast wakes every waiting Receive. s.mu must be held.
func (s *Source) broadcast() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// message converts a received SQS message.
func (s *Source) message(h *handle, now time.Time) *consumer.Message {
	m := h.raw
	attempt := 1
	if n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil && n > 0 {
		attempt = n
	}
	headers := make(map[string]string, len(m.MessageAttributes))
	for name, v := range m.MessageAttributes {
		if v.StringValue != nil {
			headers[name] = *v.StringValue // String and Number types; Binary only in Raw
		}
	}
	// The X-Ray trace header rides along for tracing hooks (otelidemq),
	// unless a message attribute of that name exists.
	const trace = string(types.MessageSystemAttributeNameAWSTraceHeader)
	if _, taken := headers[trace]; !taken && m.Attributes[trace] != "" {
		headers[trace] = m.Attributes[trace]
	}
	var dedupID string
	if s.fifo {
		dedupID = m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]
	}
	// A replayed dead letter (sqsdlq) carries the key the runner recorded
	// for the original in consumer.MetaKey. SQS names no attribute "".
	key := cmp.Or(headers[s.cfg.KeyAttribute], headers[consumer.MetaKey], dedupID)
	partition := h.group
	if !s.fifo && s.cfg.PartitionKeyAttribute != "" {
		partition = headers[s.cfg.PartitionKeyAttribute]
	}
	return consumer.Deliver(&consumer.Message{
		ID:            h.id,
		Key:           key,
		Body:          []byte(aws.ToString(m.Body)),
		Headers:       headers,
		PartitionKey:  partition,
		Topic:         s.queueName,
		Attempt:       attempt,
		Redelivered:   attempt > 1,
		ReplyTo:       headers[consumer.HeaderReplyTo],
		CorrelationID: headers[consumer.HeaderCorrelationID],
		ReceivedAt:    now,
		Raw:           m,
		Broker:        s.broker,
	}, consumer.Delivery{Handle: h})
}
