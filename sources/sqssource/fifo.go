package sqssource

import (
	"slices"

	"github.com/idemq/idemq/consumer"
)

// In strict FIFO order (a FIFO queue without Config.RelaxedFIFOOrder), a
// group's messages are handed out one at a time: take skips a group while
// Source.active holds its message, and untrack frees the group once that
// message is settled. A message that goes back to the queue (Retry, a failed
// dead letter) takes the later messages of its group still in the ready
// buffer with it (untrackWithFollowers), so that SQS delivers them again after it.

// take removes up to max messages from the ready buffer and returns them. In
// strict FIFO order it takes at most one message per group, and none of a
// group whose previous message is still being handled. s.mu must be held.
func (s *Source) take(max int) []*consumer.Message {
	if !s.strictOrder() {
		n := min(max, len(s.ready))
		out := slices.Clone(s.ready[:n])
		clear(s.ready[:n])
		s.ready = s.ready[n:]
		return out
	}
	var out []*consumer.Message
	keep := s.ready[:0]
	for _, m := range s.ready {
		h := consumer.DeliveryOf(m).Handle.(*handle)
		if len(out) == max || s.active[h.group] != nil {
			keep = append(keep, m)
			continue
		}
		s.active[h.group] = h
		out = append(out, m)
	}
	clear(s.ready[len(keep):])
	s.ready = keep
	return out
}

// strictOrder reports whether Receive hands out one message per FIFO group at
// a time.
func (s *Source) strictOrder() bool { return s.fifo && !s.cfg.RelaxedFIFOOrder }

// untrack stops tracking hs: they are settled, and no longer extended or
// released. In strict FIFO order it unblocks their groups.
func (s *Source) untrack(hs ...*handle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range hs {
		s.untrackLocked(h)
	}
}

// untrackLocked is untrack for one handle with s.mu held.
func (s *Source) untrackLocked(h *handle) {
	delete(s.inflight, h)
	if s.strictOrder() && s.active[h.group] == h {
		delete(s.active, h.group)
		s.broadcast()
	}
}

// untrackWithFollowers stops tracking h, which goes back to the queue, and, in strict
// FIFO order, also the messages of its group waiting in the ready buffer,
// which it returns: they must go back too, to follow h.
func (s *Source) untrackWithFollowers(h *handle) []*handle {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.untrackLocked(h)
	return s.detachFollowers(h)
}

// detachFollowers removes the messages of h's group from the ready buffer,
// stops tracking them and returns them (strict FIFO order only). s.mu must
// be held.
func (s *Source) detachFollowers(h *handle) []*handle {
	if !s.strictOrder() {
		return nil
	}
	var out []*handle
	keep := s.ready[:0]
	for _, m := range s.ready {
		f := consumer.DeliveryOf(m).Handle.(*handle)
		if f.group != h.group {
			keep = append(keep, m)
			continue
		}
		delete(s.inflight, f)
		out = append(out, f)
	}
	clear(s.ready[len(keep):])
	s.ready = keep
	return out
}
