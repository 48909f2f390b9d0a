package memdedup

import (
	"fmt"
	"time"
)

// EventKind says what an Event reports.
type EventKind int

// Event kinds.
const (
	// EventBegin reports a transaction begun.
	EventBegin EventKind = iota + 1
	// EventCommit reports a transaction committed; Event.Keys lists the
	// keys it recorded. With an injected Fault.Applied, Event.Err is the
	// error Commit returned although the commit happened.
	EventCommit
	// EventCommitFailed reports a commit that did not happen; the
	// transaction was rolled back.
	EventCommitFailed
	// EventRollback reports a transaction rolled back.
	EventRollback
	// EventComplete reports a lease marked done (lease path); Event.Keys
	// holds its key.
	EventComplete
	// EventAbandon reports a lease abandoned after a failed effect (lease
	// path); Event.Keys holds its key.
	EventAbandon
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case EventBegin:
		return "begin"
	case EventCommit:
		return "commit"
	case EventCommitFailed:
		return "commit-failed"
	case EventRollback:
		return "rollback"
	case EventComplete:
		return "complete"
	case EventAbandon:
		return "abandon"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Key is a deduplication key within its scope.
type Key struct {
	Scope string
	Key   string
}

// Event is one step of the store, numbered in the order the steps took
// effect.
type Event struct {
	// Seq numbers the store's events from 1, in the order they took effect.
	Seq uint64
	// Kind says what happened.
	Kind EventKind
	// Tx is the transaction's ID (0 for lease events).
	Tx uint64
	// Keys are the keys recorded by a commit, or the key of a lease event.
	Keys []Key
	// Err is the error returned to the caller, if any.
	Err error
	// At is the store's clock when the event happened.
	At time.Time
}

// Events returns a copy of every event so far, in Seq order.
func (s *Store) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Event, len(s.events))
	copy(out, s.events)
	return out
}

// event numbers and logs an event. s.mu is held.
func (s *Store) event(kind EventKind, tx uint64, keys []Key, err error) Event {
	s.seq++
	ev := Event{Seq: s.seq, Kind: kind, Tx: tx, Keys: keys, Err: err, At: s.cfg.Now()}
	s.events = append(s.events, ev)
	return ev
}

// emit passes ev to Config.OnEvent. s.mu is not held.
func (s *Store) emit(ev Event) {
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(ev)
	}
}
