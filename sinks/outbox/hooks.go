package outbox

import (
	"context"
	"time"
)

// Hook is a value that observes a Relay, like consumer.Hook observes a
// Runner: it implements any number of the interfaces below (HookPublish,
// HookSend, HookCounts), which NewRelay and NewSQLiteRelay find once by type
// assertion, so new events can be added without breaking existing hooks.
// Set hooks with Config.Hooks. consumer/otelidemq's RelayHook implements
// them with OpenTelemetry metrics.
//
// The methods use only standard types, so that a hook package need not
// import this one. Hook methods are called synchronously from the relay's
// claim loops, concurrently when Concurrency is above 1: they must be safe
// for concurrent use, fast, and must not block.
type Hook any

// HookPublish is called after each publish of a claimed batch, with the
// number of rows in the batch, how many of them the broker confirmed, how
// many were parked by this failure, how long Publisher.Publish took, and
// its error (nil when every row was confirmed). Rows neither sent nor
// parked are retried later: failed attempts, or an outage that counts none
// (ErrUnavailable).
type HookPublish interface {
	OnRelayPublish(ctx context.Context, rows, sent, parked int, d time.Duration, err error)
}

// HookSend is called after each publish of a claimed batch, with the
// messages' IDs, destinations and headers (index i is the batch's row i;
// the headers hold the W3C trace context Publish stored, if any), when
// Publisher.Publish started, how long it took and its error. It lets a
// hook make a send span linked to the trace contexts the messages were
// published from. The slices are the relay's: read them during the call
// only.
type HookSend interface {
	OnRelaySend(ctx context.Context, ids, destinations []string, headers []map[string]string, start time.Time, d time.Duration, err error)
}

// HookCounts is given, once in the relay's constructor, a function that
// reads the outbox's counts (one query, like Relay.Counts): the rows
// pending, the rows parked and the age of the oldest pending row. A
// metrics hook calls it when its gauges are collected; it is safe for
// concurrent use and honours ctx.
type HookCounts interface {
	ObserveRelayCounts(counts func(ctx context.Context) (pending, parked int64, oldestPending time.Duration, err error))
}

// hooks are a relay's hooks, sorted by the events they observe.
type hooks struct {
	publish []HookPublish
	send    []HookSend
}

// setHooks sorts cfg.Hooks into r.hooks and hands r's counts to the
// HookCounts hooks.
func (r *Relay) setHooks() {
	for _, h := range r.cfg.Hooks {
		if p, ok := h.(HookPublish); ok {
			r.hooks.publish = append(r.hooks.publish, p)
		}
		if s, ok := h.(HookSend); ok {
			r.hooks.send = append(r.hooks.send, s)
		}
		if c, ok := h.(HookCounts); ok {
			c.ObserveRelayCounts(func(ctx context.Context) (int64, int64, time.Duration, error) {
				n, err := r.Counts(ctx)
				return n.Pending, n.Parked, n.OldestPending, err
			})
		}
	}
}
