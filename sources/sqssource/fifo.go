package sqssource

import "github.com/idemq/idemq/consumer"

// take removes up to max messages from the ready buffer and returns them. In
// strict FIFO order it takes at most one message per group, and none of a
// group whose previous message is still being handled. s.mu must be held.
func (s *Source) take(max int) []*consumer.Message {
	strict := s.strictOrder()
	var out []*consumer.Message
	keep := s.ready[:0]
	for _, m := range s.ready {
		h := consumer.DeliveryOf(m).Handle.(*handle)
		if len(out) == max || strict && s.active[h.group] != nil {
			keep = append(keep, m)
			continue
		}
		if strict {
			s.active[h.group] = h
		}
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

// untrackWithFollowers stops tracking h, which goes back to the queue, and,
// in strict FIFO order, also the messages of its group waiting in the ready
// buffer, which it removes from there and returns: they must go back too,
// to follow h.
func (s *Source) untrackWithFollowers(h *handle) []*handle {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.untrackLocked(h)
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
