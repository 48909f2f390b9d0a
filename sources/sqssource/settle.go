package sqssource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/internal/brokerkit"
)

// Ack deletes msgs from the queue with DeleteMessageBatch, 10 per call, and
// returns once SQS answered for each. Concurrent Acks share calls: while a
// call is in flight, the messages of other Acks wait for it and leave
// together in the next (see deletes.go), so that one message per Ack does
// not cost one call per message. Entries that fail for a reason that is not the caller's
// fault are sent again (Config.DeleteAttempts in all); the others, such as an
// expired receipt handle (the message was received again meanwhile), are
// reported at once. The error holds a *BatchError naming the entries that
// were not deleted; those messages come back after their visibility timeout and
// are recognised as duplicates. A message that this Source did not return
// (ErrForeignMessage) does not stop the others from being deleted: the errors
// are joined.
func (s *Source) Ack(ctx context.Context, msgs []*consumer.Message) error {
	if s.isClosed() {
		return consumer.ErrClosed
	}
	var errs []error
	hs := make([]*handle, 0, len(msgs))
	for _, m := range msgs {
		h, err := s.handleOf(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		hs = append(hs, h)
	}
	s.untrack(hs...)

	failed, err := s.deleteAll(ctx, hs)
	switch {
	case len(failed) > 0:
		errs = append(errs, &BatchError{Op: "DeleteMessageBatch", Entries: failed, Err: err})
	case err != nil:
		errs = append(errs, fmt.Errorf("sqssource: ack: %w", err))
	}
	return errors.Join(errs...)
}

// deleteBatch deletes up to 10 messages, sending failed entries again while
// that can help. It returns the entries that were not deleted and the last
// request-level error.
func (s *Source) deleteBatch(ctx context.Context, hs []*handle) ([]EntryError, error) {
	var (
		failed  []EntryError
		lastErr error
		pending = hs
		reasons = make(map[*handle]EntryError)
	)
	for attempt := 1; attempt <= s.cfg.DeleteAttempts && len(pending) > 0; attempt++ {
		if attempt > 1 && !brokerkit.Sleep(ctx.Done(), time.Duration(50<<attempt)*time.Millisecond) {
			break
		}
		entries := make([]types.DeleteMessageBatchRequestEntry, len(pending))
		for i, h := range pending {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(h.receipt)}
		}
		cctx, cancel := s.requestContext(ctx)
		out, err := s.client.DeleteMessageBatch(cctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(s.cfg.QueueURL), Entries: entries})
		cancel()
		if err != nil {
			lastErr = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		var again []*handle
		for _, f := range out.Failed {
			i, err := strconv.Atoi(aws.ToString(f.Id))
			if err != nil || i < 0 || i >= len(pending) {
				// A malformed answer: which entries were deleted is
				// unknown, so report every entry still pending as failed.
				err := fmt.Errorf("sqssource: DeleteMessageBatch answered for unknown entry %q", aws.ToString(f.Id))
				for _, h := range pending {
					failed = append(failed, EntryError{MessageID: h.id, Code: "InvalidResponse", Message: err.Error()})
				}
				return failed, err
			}
			h := pending[i]
			e := EntryError{MessageID: h.id, Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
			if f.SenderFault {
				failed = append(failed, e)
				continue
			}
			reasons[h] = e
			again = append(again, h)
		}
		pending = again
	}
	for _, h := range pending {
		e, ok := reasons[h]
		if !ok {
			e = EntryError{MessageID: h.id, Code: "RequestFailed", Message: fmt.Sprint(lastErr)}
		}
		failed = append(failed, e)
	}
	return failed, lastErr
}

// Retry makes msg visible again after delay (rounded up to whole seconds, at
// most what is left of the 12-hour visibility limit) with
// ChangeMessageVisibility. SQS then delivers it again with a higher
// ApproximateReceiveCount, hence a higher Attempt. On a FIFO queue the
// message's group waits for it, and, unless Config.RelaxedFIFOOrder, the
// later messages of its group that were already received are made visible
// again so that they follow it. If the call fails, the message comes back
// when its current visibility timeout ends.
func (s *Source) Retry(ctx context.Context, msg *consumer.Message, delay time.Duration) error {
	if s.isClosed() {
		return consumer.ErrClosed
	}
	h, err := s.handleOf(msg)
	if err != nil {
		return err
	}
	delay = min(max(delay, 0), MaxVisibility-time.Since(h.receivedAt)-time.Second)
	if err := s.setVisibility(ctx, h, delay); err != nil {
		return fmt.Errorf("sqssource: retry %s: %w", h.id, err)
	}
	s.stats.retried.Add(1)
	return nil
}

// setVisibility stops tracking h and makes it visible after d. In strict FIFO
// order it then returns the messages of h's group waiting in the ready buffer
// to the queue, so that SQS delivers them again after h.
func (s *Source) setVisibility(ctx context.Context, h *handle, d time.Duration) error {
	s.visMu.RLock()
	defer s.visMu.RUnlock()
	followers := s.untrackWithFollowers(h)
	cctx, cancel := s.requestContext(ctx)
	_, err := s.client.ChangeMessageVisibility(cctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl:          aws.String(s.cfg.QueueURL),
		ReceiptHandle:     aws.String(h.receipt),
		VisibilityTimeout: seconds(d),
	})
	cancel()
	for chunk := range slices.Chunk(followers, MaxBatch) {
		if _, ferr := s.changeVisibility(ctx, chunk, func(*handle) time.Duration { return 0 }); ferr != nil {
			s.log.WarnContext(ctx, "returning later messages of a FIFO group failed; they return after their visibility timeout",
				consumer.LogKeyID, h.id, consumer.LogKeyError, ferr)
		}
	}
	return err
}

// changeVisibility sets the visibility of up to 10 messages with one
// ChangeMessageVisibilityBatch call. It returns the handles that succeeded and
// an error describing the others.
func (s *Source) changeVisibility(ctx context.Context, hs []*handle, d func(*handle) time.Duration) ([]*handle, error) {
	entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(hs))
	for i, h := range hs {
		entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{
			Id:                aws.String(strconv.Itoa(i)),
			ReceiptHandle:     aws.String(h.receipt),
			VisibilityTimeout: seconds(d(h)),
		}
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	out, err := s.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{
		QueueUrl: aws.String(s.cfg.QueueURL),
		Entries:  entries,
	})
	if err != nil {
		return nil, err
	}
	failed := make(map[int]EntryError, len(out.Failed))
	for _, f := range out.Failed {
		i, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || i < 0 || i >= len(hs) {
			return nil, fmt.Errorf("sqssource: ChangeMessageVisibilityBatch answered for unknown entry %q", aws.ToString(f.Id))
		}
		failed[i] = EntryError{MessageID: hs[i].id, Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
	}
	if len(failed) == 0 {
		return hs, nil
	}
	ok := make([]*handle, 0, len(hs)-len(failed))
	be := &BatchError{Op: "ChangeMessageVisibilityBatch"}
	for i, h := range hs {
		if e, bad := failed[i]; bad {
			be.Entries = append(be.Entries, e)
			continue
		}
		ok = append(ok, h)
	}
	return ok, be
}

// seconds rounds d up to whole seconds for SQS, within [0, 12 h].
func seconds(d time.Duration) int32 {
	d = min(max(d, 0), MaxVisibility)
	return int32((d + time.Second - 1) / time.Second)
}
