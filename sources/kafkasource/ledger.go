package kafkasource

import (
	"slices"

	"github.com/segmentio/kafka-go"
)

type topicPartition struct {
	topic     string
	partition int
}

// partition is the commit queue of one topic partition.
type partition struct {
	topicPartition
	// queue holds the fetched entries not yet passed by the settled
	// prefix, in fetch order.
	queue []*entry
	// doneUpTo is the highest offset passed by the settled prefix (-1:
	// none). Every message at or below it is durable (see doc.go).
	doneUpTo int64
	// doneGen is the generation tag of the newest entry passed.
	doneGen int64
	// committed is the next offset this source committed (0: none).
	committed int64
	// fetchGen is the generation tag of the newest entry fetched.
	fetchGen int64
}

// hold keeps later messages of one key back while an earlier one waits for
// a retry, so that retries do not reorder a key.
type hold struct {
	// blockers counts the handed-out, unsettled messages of the key that
	// the later ones wait for.
	blockers int
	// queue holds the later messages, in fetch order.
	queue []*entry
	// waiting holds the messages of the key whose redelivery timer runs.
	waiting []*entry
}

// settleLocked marks e settled, frees its slot, releases messages held
// behind it and advances its partition's settled prefix.
func (s *Source) settleLocked(e *entry) {
	if e.settled {
		return
	}
	e.settled = true
	e.km = kafka.Message{} // the payload is no longer needed
	e.timerSeq++           // a pending redelivery is void
	if t := s.timers[e]; t != nil {
		t.Stop()
		delete(s.timers, e)
		s.unwaitLocked(e)
	}
	if e.slot {
		<-s.slots
		e.slot = false
	}
	s.inFlight--
	if e.blocker {
		s.unblockLocked(e)
	}
	p := e.part
	advanced := false
	for len(p.queue) > 0 && p.queue[0].settled {
		head := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		<-s.retained
		p.doneUpTo = max(p.doneUpTo, head.offset)
		p.doneGen = head.gen
		advanced = true
	}
	if advanced {
		s.dirty[p] = struct{}{}
	}
}

// blockLocked makes e a message that later messages of its key wait for.
func (s *Source) blockLocked(e *entry) {
	if e.holdKey == "" || e.blocker {
		return
	}
	h := s.holds[e.holdKey]
	if h == nil {
		h = &hold{}
		s.holds[e.holdKey] = h
	}
	h.blockers++
	e.blocker = true
}

// unblockLocked is called when blocker e is settled. When no blocker of its
// key is left, the messages held behind them are handed out together, and
// they become the blockers of the messages fetched after them.
func (s *Source) unblockLocked(e *entry) {
	e.blocker = false
	h := s.holds[e.holdKey]
	h.blockers--
	if h.blockers > 0 {
		return
	}
	if len(h.queue) == 0 {
		delete(s.holds, e.holdKey)
		return
	}
	released := h.queue
	h.queue = nil
	h.blockers = len(released)
	for _, q := range released {
		q.blocker = true
		s.ready <- s.message(q, 1)
	}
}

// unwaitLocked removes e from its key's messages waiting for a redelivery.
func (s *Source) unwaitLocked(e *entry) {
	h := s.holds[e.holdKey]
	if e.holdKey == "" || h == nil {
		return
	}
	if i := slices.Index(h.waiting, e); i >= 0 {
		h.waiting = slices.Delete(h.waiting, i, i+1)
	}
}
