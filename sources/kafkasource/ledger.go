package kafkasource

import (
	"cmp"
	"slices"
	"time"
)

// ledger is a Source's record of what it fetched and settled, which decides
// what it may commit and in which order it hands messages out:
//
//   - per partition, the fetched messages in fetch order and the settled
//     prefix: the longest run of settled messages at the head of the queue,
//     which is all that is ever committed;
//   - the generation fence: a prefix whose newest message was fetched in an
//     older consumer-group generation than the current one is not committed;
//   - per key (Config.Ordering), the holds: messages fetched while an earlier
//     message of their key waits for a retry are held back until it settles.
//
// The ledger does no I/O, starts no timers and takes no locks; the Source
// calls it with Source.mu held and turns what it returns into channel sends
// and commit requests.
type ledger struct {
	partitions map[topicPartition]*partition
	// dirty holds the partitions whose settled prefix advanced since
	// committable last ran.
	dirty map[*partition]struct{}
	// holds has a hold per key with a blocker; never one for the key "".
	holds map[string]*hold
}

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
	// hole is the lowest offset of a dropped entry (settled without an
	// effect) that the prefix passed (-1: none); holeJoin is the newest
	// generation join of such entries. No commit passes hole until the
	// prefix passes an entry of a later join at or past it.
	hole     int64
	holeJoin int64
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

// prefix is the settled prefix of one partition, as committable hands it to
// a commit request.
type prefix struct {
	topicPartition
	// last is the offset of the newest message passed; the offset to
	// commit is last+1.
	last int64
	// prev is the partition's committed offset before this request, which
	// uncommit restores when the request fails.
	prev int64
	part *partition
}

func newLedger() *ledger {
	return &ledger{
		partitions: make(map[topicPartition]*partition),
		dirty:      make(map[*partition]struct{}),
		holds:      make(map[string]*hold),
	}
}

// record appends e, fetched from tp in generation e.gen, to its partition's
// queue. It reports whether e is held back behind a retried message of its
// key; a held message is returned by a later settle, when its key's last
// blocker settles, and must not be handed out before.
func (l *ledger) record(tp topicPartition, e *entry) (held bool) {
	p := l.partitions[tp]
	if p == nil {
		p = &partition{topicPartition: tp, doneUpTo: -1, hole: -1}
		l.partitions[tp] = p
	}
	e.part = p
	p.fetchGen = e.gen
	p.queue = append(p.queue, e)
	h := l.holds[e.holdKey]
	if h == nil {
		return false
	}
	h.queue = append(h.queue, e)
	return true
}

// settle marks e settled and advances its partition's settled prefix past
// every settled entry at the head of the queue. It returns the entries held
// behind e that are to be handed out now (when e was the last blocker of its
// key; they become the blockers of the messages fetched after them), and how
// many entries the prefix passed. Settling an entry twice does nothing.
func (l *ledger) settle(e *entry) (released []*entry, passed int) {
	if e.settled {
		return nil, 0
	}
	e.settled = true
	if e.blocker {
		released = l.unblock(e)
	}
	p := e.part
	for len(p.queue) > 0 && p.queue[0].settled {
		head := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		passed++
		if head.dropped {
			// Not durable: the new generation fetches it again from
			// the committed offset, which must not pass it.
			if p.hole < 0 || head.offset < p.hole {
				p.hole = head.offset
			}
			p.holeJoin = max(p.holeJoin, head.join)
			continue
		}
		p.doneUpTo = max(p.doneUpTo, head.offset)
		p.doneGen = head.gen
		if p.hole >= 0 && head.join > p.holeJoin && head.offset >= p.hole {
			// A later generation fetched from at most hole and
			// settled every message up to here, in offset order.
			p.hole = -1
		}
	}
	if passed > 0 {
		l.dirty[p] = struct{}{}
	}
	return released, passed
}

// block makes e, which waits for a retry, a message that the later fetched
// messages of its key wait for. It does nothing for a message without a
// hold key or one that already blocks.
func (l *ledger) block(e *entry) {
	if e.holdKey == "" || e.blocker {
		return
	}
	h := l.holds[e.holdKey]
	if h == nil {
		h = &hold{}
		l.holds[e.holdKey] = h
	}
	h.blockers++
	e.blocker = true
}

// unblock is called when blocker e is settled. When no blocker of its key is
// left, it returns the messages held behind them, which become the blockers
// of the messages fetched after them.
func (l *ledger) unblock(e *entry) []*entry {
	e.blocker = false
	h := l.holds[e.holdKey]
	h.blockers--
	if h.blockers > 0 {
		return nil
	}
	if len(h.queue) == 0 {
		delete(l.holds, e.holdKey)
		return nil
	}
	released := h.queue
	h.queue = nil
	h.blockers = len(released)
	for _, q := range released {
		q.blocker = true
	}
	return released
}

// wait records that e's redelivery timer started (due at e.due), when its
// key is held.
func (l *ledger) wait(e *entry) {
	if h := l.holds[e.holdKey]; h != nil {
		h.waiting = append(h.waiting, e)
	}
}

// unwait removes e from its key's messages waiting for a redelivery.
func (l *ledger) unwait(e *entry) {
	h := l.holds[e.holdKey]
	if h == nil {
		return
	}
	if i := slices.Index(h.waiting, e); i >= 0 {
		h.waiting = slices.Delete(h.waiting, i, i+1)
	}
}

// due is called when e's redelivery timer fires. It returns e together with
// every other message of its key whose redelivery is due at now, in offset
// order, and stops counting them as waiting: their timers race, and a later
// message must not overtake an earlier one.
func (l *ledger) due(e *entry, now time.Time) []*entry {
	h := l.holds[e.holdKey]
	if h == nil {
		return []*entry{e}
	}
	var due []*entry
	kept := h.waiting[:0]
	for _, w := range h.waiting {
		if w == e || !w.due.After(now) {
			due = append(due, w)
		} else {
			kept = append(kept, w)
		}
	}
	clear(h.waiting[len(kept):])
	h.waiting = kept
	slices.SortFunc(due, func(a, b *entry) int { return cmp.Compare(a.offset, b.offset) })
	return due
}

// committable empties the set of partitions whose prefix advanced and
// returns, for each of them whose prefix passed an offset not requested
// before, its prefix: in commit, marked as requested, when the newest
// message passed was fetched in generation gen; in stale, not marked, when
// it was fetched in another (older) generation, whose partitions the group
// may have given to another member.
func (l *ledger) committable(gen int64) (commit, stale []prefix) {
	for p := range l.dirty {
		delete(l.dirty, p)
		pf := prefix{topicPartition: p.topicPartition, last: p.durableUpTo(), prev: p.committed, part: p}
		switch {
		case pf.last < p.committed:
			// Nothing new (or behind what this source requested before).
		case p.doneGen != gen:
			stale = append(stale, pf)
		default:
			commit = append(commit, pf)
			p.committed = pf.last + 1
		}
	}
	return commit, stale
}

// durableUpTo is the highest offset that may be committed past: doneUpTo,
// held below a dropped entry's offset (see settle).
func (p *partition) durableUpTo() int64 {
	if p.hole >= 0 {
		return min(p.doneUpTo, p.hole-1)
	}
	return p.doneUpTo
}

// uncommit undoes committable's marking of commit, whose request failed, so
// that the next committable returns those prefixes again.
func (l *ledger) uncommit(commit []prefix) {
	for _, c := range commit {
		// A concurrent request may have queued a higher offset; going
		// back only makes the next request repeat it.
		c.part.committed = min(c.part.committed, c.prev)
		l.dirty[c.part] = struct{}{}
	}
}

// next returns, for each partition fetched from in generation gen, the
// first offset its settled prefix has not passed: the offset the source
// will commit next.
func (l *ledger) next(gen int64) map[topicPartition]int64 {
	out := make(map[topicPartition]int64)
	for tp, p := range l.partitions {
		if p.fetchGen != gen {
			continue // fetched before the latest rebalance: maybe another member's now
		}
		out[tp] = p.durableUpTo() + 1
		if out[tp] == 0 && len(p.queue) > 0 {
			out[tp] = p.queue[0].offset
		}
	}
	return out
}

// held returns the number of messages held behind a retried message of
// their key.
func (l *ledger) held() int {
	n := 0
	for _, h := range l.holds {
		n += len(h.queue)
	}
	return n
}

// uncommitted returns the number of messages not yet passed by their
// partition's settled prefix.
func (l *ledger) uncommitted() int {
	n := 0
	for _, p := range l.partitions {
		n += len(p.queue)
	}
	return n
}
