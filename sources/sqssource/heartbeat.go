package sqssource

import (
	"errors"
	"slices"
	"time"

	"github.com/idemq/idemq/consumer"
)

// heartbeat extends the visibility of in-flight messages every
// Config.HeartbeatInterval until Close. The runner does not say when a
// handler starts, so a message is in flight from the moment ReceiveMessage
// returns it until Ack, Retry or DeadLetter settles it: the span covers its
// wait for a lane, its handler and its commit. With an interval of at most
// half the visibility timeout, a message is extended at the latest 1.5
// intervals after its timeout started, while at least a quarter of it is
// left. Past Config.MaxExtension from its receive, or once SQS refuses its
// receipt handle (it was received again, or deleted), a message is no
// longer extended, so a stuck handler cannot hide it for ever.
func (s *Source) heartbeat() {
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-s.closeCtx.Done():
			return
		case now := <-t.C:
			for chunk := range slices.Chunk(s.due(now), MaxBatch) {
				if s.closeCtx.Err() != nil {
					return
				}
				s.extendBatch(chunk)
			}
		}
	}
}

// due returns the in-flight messages that need an extension now, and stops
// extending those past MaxExtension.
func (s *Source) due(now time.Time) []*handle {
	s.mu.Lock()
	defer s.mu.Unlock()
	var due []*handle
	for h := range s.inflight {
		switch {
		case h.done:
		case now.Sub(h.receivedAt) >= s.cfg.MaxExtension:
			s.giveUp(h, now)
		case now.Sub(h.extendedAt) >= s.cfg.HeartbeatInterval/2:
			due = append(due, h)
		}
	}
	return due
}

// extendBatch extends up to 10 messages with one call. It holds visMu
// exclusively so that no Retry or DeadLetter changes the visibility of one
// of them meanwhile, and skips those settled since due picked them.
func (s *Source) extendBatch(hs []*handle) {
	s.visMu.Lock()
	defer s.visMu.Unlock()

	s.mu.Lock()
	live := hs[:0]
	for _, h := range hs {
		if _, ok := s.inflight[h]; ok {
			live = append(live, h)
		}
	}
	s.mu.Unlock()
	if len(live) == 0 {
		return
	}

	start := time.Now()
	visibility := func(h *handle) time.Duration {
		return min(s.cfg.VisibilityTimeout, h.receivedAt.Add(s.cfg.MaxExtension).Sub(start))
	}
	ok, err := s.changeVisibility(s.closeCtx, live, visibility)

	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range ok {
		h.extendedAt = start
		if visibility(h) < s.cfg.VisibilityTimeout {
			s.giveUp(h, start) // this extension reached MaxExtension
		}
	}
	s.stats.extended.Add(uint64(len(ok)))
	if err == nil {
		return
	}
	var be *BatchError
	if !errors.As(err, &be) {
		s.stats.extendFailures.Add(uint64(len(live)))
		s.log.WarnContext(s.closeCtx, "extending visibility failed; retried on the next tick", consumer.LogKeyCount, len(live), consumer.LogKeyError, err)
		return
	}
	s.stats.extendFailures.Add(uint64(len(be.Entries)))
	for _, e := range be.Entries {
		for _, h := range live {
			if h.id == e.MessageID && e.SenderFault {
				h.done = true // receipt handle invalid: deleted or received again
			}
		}
	}
	s.log.WarnContext(s.closeCtx, "extending visibility failed for some messages", consumer.LogKeyCount, len(be.Entries), consumer.LogKeyError, be)
}

// giveUp stops extending h, which reached MaxExtension. s.mu must be held.
func (s *Source) giveUp(h *handle, now time.Time) {
	h.done = true
	s.stats.expired.Add(1)
	s.log.WarnContext(s.closeCtx, "message in flight for MaxExtension; no longer extended, it becomes visible again",
		consumer.LogKeyID, h.id, "in_flight", now.Sub(h.receivedAt).Round(time.Millisecond), "max_extension", s.cfg.MaxExtension)
}
