// Package memqueue is the queue of the in-memory broker, consumer/memsource
// (which consumer/consumertest replays on): messages in publish order,
// delivered at least once, each delivery visible to one source until it is
// settled or its visibility timeout passes, retry delays, owed duplicate
// copies, and the messages of one partition key delivered one at a time, in
// publish order, as a real broker orders a partition.
//
// A Queue does no locking: its broker holds its own lock around every call.
// Messages carry the broker's payload P; S identifies a source (the zero S
// means "any source" in an owed copy).
package memqueue

import (
	"context"
	"time"
)

// Queue is one topic's messages. The zero value is not usable; call New.
type Queue[P any, S comparable] struct {
	msgs      []*Message[P, S] // publish order; settled entries are compacted away
	settled   int              // settled entries still in msgs
	nextDeliv uint64
	changed   chan struct{}
}

// Message is one published message.
type Message[P any, S comparable] struct {
	// ID and PartitionKey are the message's; Payload is the broker's.
	ID           string
	PartitionKey string
	Payload      P
	// Deliveries counts the deliveries so far; the next Attempt is
	// Deliveries+1.
	Deliveries int

	live        map[uint64]*Delivery[P, S] // outstanding deliveries by number
	availableAt time.Time                  // not deliverable before (Retry delay)
	extra       []S                        // owed copies: zero S any source, else any source but this one
	done        bool                       // acknowledged or dead-lettered
}

// Done reports whether m was settled (acknowledged or dead-lettered).
func (m *Message[P, S]) Done() bool { return m.done }

// InFlight reports whether a delivery of m is outstanding.
func (m *Message[P, S]) InFlight() bool { return len(m.live) > 0 }

// Delivery is one handing-out of a message to a source.
type Delivery[P any, S comparable] struct {
	n        uint64
	Msg      *Message[P, S]
	Src      S
	Attempt  int
	Deadline time.Time
}

// New returns an empty queue.
func New[P any, S comparable]() *Queue[P, S] {
	return &Queue[P, S]{changed: make(chan struct{})}
}

// Changed is closed when a message may have become deliverable; a receiver
// that found nothing waits on it (taken under the broker's lock).
func (q *Queue[P, S]) Changed() <-chan struct{} { return q.changed }

// Wake wakes the receivers waiting on Changed.
func (q *Queue[P, S]) Wake() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// Publish appends a message; the caller wakes the receivers (once for
// several messages).
func (q *Queue[P, S]) Publish(id, partitionKey string, p P) *Message[P, S] {
	m := &Message[P, S]{ID: id, PartitionKey: partitionKey, Payload: p, live: make(map[uint64]*Delivery[P, S])}
	q.msgs = append(q.msgs, m)
	return m
}

// Hooks tell Take's caller what happened.
type Hooks[P any, S comparable] struct {
	// Deliver is called for each delivery made, in order.
	Deliver func(d *Delivery[P, S])
	// Expire, if set, is called for each delivery whose visibility timeout
	// Take found passed.
	Expire func(d *Delivery[P, S])
	// Copies, if set, is called after a message's fresh (not owed)
	// delivery: duplicate owes a copy to any source, concurrent a copy to
	// another source than the one that took it.
	Copies func(m *Message[P, S]) (duplicate, concurrent bool)
}

// Take delivers up to max messages to src, visible to it for vis, and
// returns the earliest instant at which a delivery may expire or a delayed
// message become ready (zero if none).
func (q *Queue[P, S]) Take(src S, now time.Time, max int, vis time.Duration, h Hooks[P, S]) (wake time.Time) {
	var (
		n       int
		blocked map[string]bool // partition keys whose next message must not go to src
		any     S
	)
	later := func(at time.Time) {
		if wake.IsZero() || at.Before(wake) {
			wake = at
		}
	}
	block := func(pk string) {
		if pk == "" {
			return
		}
		if blocked == nil {
			blocked = make(map[string]bool)
		}
		blocked[pk] = true
	}
	deliver := func(m *Message[P, S]) {
		m.Deliveries++
		q.nextDeliv++
		d := &Delivery[P, S]{n: q.nextDeliv, Msg: m, Src: src, Attempt: m.Deliveries, Deadline: now.Add(vis)}
		m.live[d.n] = d
		later(d.Deadline)
		n++
		h.Deliver(d)
	}
	// owed delivers the copies of m that src may take now.
	owed := func(m *Message[P, S]) {
		for i := 0; i < len(m.extra) && n < max; {
			if m.extra[i] == src {
				i++
				continue
			}
			m.extra = append(m.extra[:i], m.extra[i+1:]...)
			deliver(m)
		}
	}
	for _, m := range q.msgs {
		if n >= max {
			break
		}
		if m.done {
			continue
		}
		pk := m.PartitionKey
		for k, d := range m.live {
			if now.Before(d.Deadline) {
				later(d.Deadline)
				continue
			}
			delete(m.live, k)
			if h.Expire != nil {
				h.Expire(d)
			}
		}
		if len(m.live) > 0 {
			for _, d := range m.live {
				if d.Src != src {
					block(pk)
				}
			}
			owed(m)
			continue
		}
		if blocked[pk] {
			continue
		}
		if now.Before(m.availableAt) {
			later(m.availableAt)
			block(pk)
			continue
		}
		deliver(m)
		if h.Copies != nil {
			duplicate, concurrent := h.Copies(m)
			if duplicate {
				m.extra = append(m.extra, any)
			}
			if concurrent {
				m.extra = append(m.extra, src)
			}
		}
		owed(m)
	}
	return wake
}

// Status is what a delivery's settlement finds.
type Status int

const (
	// Live means the delivery counts; it may be settled.
	Live Status = iota
	// Settled means its message was settled already (a no-op).
	Settled
	// Expired means the delivery no longer counts (its visibility timeout
	// passed, or its source was closed, or the broker restarted).
	Expired
	// TimedOut means its visibility timeout passed just now; Check removed
	// it.
	TimedOut
)

// Check tells whether d still counts at now, removing it (and waking
// receivers) when its visibility timeout has passed.
func (q *Queue[P, S]) Check(d *Delivery[P, S], now time.Time) Status {
	m := d.Msg
	switch {
	case m.done:
		return Settled
	case m.live[d.n] != d:
		return Expired
	case !now.Before(d.Deadline):
		delete(m.live, d.n)
		q.Wake()
		return TimedOut
	}
	return Live
}

// Retry hands d's message back, deliverable again no sooner than delay
// after now.
func (q *Queue[P, S]) Retry(d *Delivery[P, S], now time.Time, delay time.Duration) {
	delete(d.Msg.live, d.n)
	d.Msg.availableAt = now.Add(max(delay, 0))
	q.Wake()
}

// Settle marks m acknowledged or dead-lettered: it is never delivered
// again, and the next message of its partition key may go.
func (q *Queue[P, S]) Settle(m *Message[P, S]) {
	m.done = true
	clear(m.live)
	m.extra = nil
	q.settled++
	q.compact()
	q.Wake()
}

// compact drops settled messages once they are the majority.
func (q *Queue[P, S]) compact() {
	if q.settled < 64 || q.settled*2 < len(q.msgs) {
		return
	}
	kept := q.msgs[:0]
	for _, m := range q.msgs {
		if !m.done {
			kept = append(kept, m)
		}
	}
	clear(q.msgs[len(kept):])
	q.msgs, q.settled = kept, 0
}

// Release ends the outstanding deliveries to src (a closed source), or to
// every source when all is true (a broker restart): their messages are
// deliverable again at once. returned is called for each message left with
// no outstanding delivery.
func (q *Queue[P, S]) Release(src S, all bool, returned func(m *Message[P, S])) {
	for _, m := range q.msgs {
		if m.done {
			continue
		}
		held := false
		for k, d := range m.live {
			if all || d.Src == src {
				delete(m.live, k)
				held = true
			}
		}
		if held && len(m.live) == 0 && returned != nil {
			returned(m)
		}
	}
	q.Wake()
}

// Counts returns the unsettled messages: ready (none outstanding) and in
// flight.
func (q *Queue[P, S]) Counts() (ready, inFlight int) {
	for _, m := range q.msgs {
		switch {
		case m.done:
		case len(m.live) > 0:
			inFlight++
		default:
			ready++
		}
	}
	return ready, inFlight
}

// Wait blocks a receiver that found nothing until ctx is done, stop or
// changed (Queue.Changed, taken under the broker's lock) is closed, or, when
// timed, d has passed (the wake instant Take returned).
func Wait(ctx context.Context, stop, changed <-chan struct{}, d time.Duration, timed bool) {
	var fired <-chan time.Time
	if timed {
		t := time.NewTimer(d)
		defer t.Stop()
		fired = t.C
	}
	select {
	case <-ctx.Done():
	case <-stop:
	case <-changed:
	case <-fired:
	}
}
