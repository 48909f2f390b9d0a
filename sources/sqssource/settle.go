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
// together in the next. Entries that fail for a reason that is not the
// caller's fault are sent again (Config.DeleteAttempts in all); the others,
// such as an expired receipt handle (the message was received again
// meanwhile), are reported at once. The error holds a *BatchError naming
// the entries that were not deleted; those messages come back after their
// visibility timeout and are recognised as duplicates. A message that this
// Source did not return (ErrForeignMessage) does not stop the others from
// being deleted: the errors are joined.
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
			i, e, err := entryError("DeleteMessageBatch", f, pending)
			if err != nil {
				// A malformed answer: which entries were deleted is
				// unknown, so report every entry still pending as failed.
				for _, h := range pending {
					failed = append(failed, EntryError{MessageID: h.id, Code: "InvalidResponse", Message: err.Error()})
				}
				return failed, err
			}
			if e.SenderFault {
				failed = append(failed, e)
				continue
			}
			reasons[pending[i]] = e
			again = append(again, pending[i])
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
	if err := s.setVisibility(ctx, h, h.within(delay)); err != nil {
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
	if len(out.Failed) == 0 {
		return hs, nil
	}
	ok := slices.Clone(hs)
	be := &BatchError{Op: "ChangeMessageVisibilityBatch"}
	for _, f := range out.Failed {
		i, e, err := entryError(be.Op, f, hs)
		if err != nil {
			return nil, err
		}
		ok[i] = nil
		be.Entries = append(be.Entries, e)
	}
	return slices.DeleteFunc(ok, func(h *handle) bool { return h == nil }), be
}

// entryError returns the index among hs of the entry that f, from an op
// call's answer, names, and f as an EntryError; or an error when f names
// none of them.
func entryError(op string, f types.BatchResultErrorEntry, hs []*handle) (int, EntryError, error) {
	i, err := strconv.Atoi(aws.ToString(f.Id))
	if err != nil || i < 0 || i >= len(hs) {
		return 0, EntryError{}, fmt.Errorf("sqssource: %s answered for unknown entry %q", op, aws.ToString(f.Id))
	}
	return i, EntryError{MessageID: hs[i].id, Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}, nil
}

// seconds rounds d up to whole seconds for SQS, within [0, 12 h].
func seconds(d time.Duration) int32 {
	d = min(max(d, 0), MaxVisibility)
	return int32((d + time.Second - 1) / time.Second)
}

// maxDeleteCalls bounds the DeleteMessageBatch calls that a Source has in
// flight at once.
const maxDeleteCalls = 10

// The deletes of concurrent Acks share DeleteMessageBatch calls: an Ack's
// entries join a queue, and a call takes up to 10 of them. A call starts at
// once when none is in flight, or when 10 entries are waiting (up to
// maxDeleteCalls calls); otherwise the entries wait for the call in flight to
// return and leave together with what else queued meanwhile. At one message
// per Ack and several lanes, that is one call per lane-round instead of one
// per message, with no timer and no added latency while the queue is quiet.

// deleteWaiter is one Ack waiting for its entries.
type deleteWaiter struct {
	left   int // entries not answered yet; guarded by Source.mu
	failed []EntryError
	err    error // the last request-level error of a call with a failed entry
	done   chan struct{}
}

// pendingDelete is an entry waiting for a DeleteMessageBatch call.
type pendingDelete struct {
	h *handle
	w *deleteWaiter
}

// deleteAll deletes hs through the shared calls and returns the entries that
// were not deleted, or ctx's error when ctx ends first (the calls go on, and
// messages they do not delete come back as duplicates).
func (s *Source) deleteAll(ctx context.Context, hs []*handle) ([]EntryError, error) {
	if len(hs) == 0 {
		return nil, nil
	}
	w := &deleteWaiter{left: len(hs), done: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, consumer.ErrClosed
	}
	for _, h := range hs {
		s.deletes = append(s.deletes, pendingDelete{h: h, w: w})
	}
	s.startDeletes()
	s.mu.Unlock()
	select {
	case <-w.done:
		return w.failed, w.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startDeletes starts the DeleteMessageBatch calls the queue calls for.
// s.mu must be held, and Close must not have begun waiting for s.bg unless
// a call is in flight (the caller is then that call's goroutine).
func (s *Source) startDeletes() {
	for len(s.deletes) > 0 && (s.deleteCalls == 0 || len(s.deletes) >= MaxBatch && s.deleteCalls < maxDeleteCalls) {
		n := min(MaxBatch, len(s.deletes))
		batch := slices.Clone(s.deletes[:n])
		clear(s.deletes[:n])
		s.deletes = s.deletes[n:]
		s.deleteCalls++
		s.bg.Go(func() { s.deleteCall(batch) })
	}
}

// deleteCall sends one DeleteMessageBatch (with its retries of failed
// entries), answers the waiting Acks, and starts the next call.
func (s *Source) deleteCall(batch []pendingDelete) {
	hs := make([]*handle, len(batch))
	for i, p := range batch {
		hs[i] = p.h
	}
	// Not the Ack's context: the entries of several Acks share the call,
	// and each attempt is bounded by Config.RequestTimeout.
	failed, err := s.deleteBatch(context.Background(), hs)
	s.stats.deleted.Add(uint64(len(hs) - len(failed)))
	s.stats.deleteFailures.Add(uint64(len(failed)))
	byID := make(map[string]EntryError, len(failed))
	for _, e := range failed {
		byID[e.MessageID] = e
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleteCalls--
	for _, p := range batch {
		if e, ok := byID[p.h.id]; ok {
			p.w.failed = append(p.w.failed, e)
			if err != nil {
				p.w.err = err
			}
		}
		if p.w.left--; p.w.left == 0 {
			close(p.w.done)
		}
	}
	s.startDeletes()
}
