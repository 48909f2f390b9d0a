package sqssource

import (
	"context"
	"slices"

	"github.com/idemq/idemq/consumer"
)

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
