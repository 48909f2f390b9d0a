package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/idemq/idemq/dedup"
)

// Hook is a value that observes a Runner. It implements any number of the
// Hook* interfaces below (HookReceived, HookClaimed, ...); the runner finds
// out which once, in NewRunner, by type assertion, so new events can be added
// without breaking existing hooks. Set hooks with Config.Hooks.
//
// Hook methods are called synchronously from the runner's goroutines (the
// receive loop and the lanes), concurrently for different messages: they must
// be safe for concurrent use and fast, and must not block. They must not
// modify the Message. A runner without hooks pays nothing for them: no call,
// no allocation.
//
// The ctx passed to per-message events is the message's context: the one the
// HookReceived hooks returned for it (so a tracing hook can carry a span from
// event to event), holding the runner's context values but not its
// cancellation.
type Hook any

// HookReceived is called once per message received from the source, in the
// receive loop, before the message is handed to a lane. The context it returns
// becomes the message's context: it is passed to the message's later events,
// and its values are visible to the handler's context (for example a span, so
// that the handler's spans and logs join the message's trace). Return ctx
// unchanged to add nothing.
type HookReceived interface {
	OnReceived(ctx context.Context, m *Message) context.Context
}

// HookBatch is called when a lane forms a batch, before the batch's keys
// are checked and claimed, with the number of messages in it.
type HookBatch interface {
	OnBatch(ctx context.Context, size int)
}

// DuplicateReason is the runner's best guess of why a duplicate arrived. The
// runner cannot see the producer or the other workers, so it guesses from
// what it knows, in this order:
//
//   - DuplicateConcurrent: the same key came earlier in the same batch, so
//     two copies were in flight at once (a producer's quick re-send or the
//     broker redelivering while the first copy was still being handled);
//   - DuplicateRedelivery: the broker marks the delivery as a repeat
//     (Message.Redelivered, or Attempt above 1): the first delivery's effect
//     committed but its acknowledgement was lost, or the consumer stopped
//     before acknowledging;
//   - DuplicateProducer: a first delivery whose key is already processed,
//     that is another broker message carrying the same key: the producer
//     sent it again. Brokers that do not mark redeliveries (Kafka after a
//     rebalance or a lost offset commit; SQS reports its receive count, and
//     RabbitMQ its redelivered flag, so they do) put their redeliveries here
//     too.
type DuplicateReason int

// Duplicate reasons; see DuplicateReason.
const (
	DuplicateRedelivery DuplicateReason = iota + 1
	DuplicateConcurrent
	DuplicateProducer
)

// String returns "redelivery", "concurrent" or "producer".
func (r DuplicateReason) String() string { return nameOf(r, "redelivery", "concurrent", "producer") }

// ClaimInfo describes the claim of one message's key.
type ClaimInfo struct {
	// State is dedup.StateNew (the key was not processed; the handler
	// runs) or dedup.StateDone (a duplicate: the key was processed before,
	// and the message is acknowledged without running the handler).
	State dedup.State
	// Reason is why a duplicate arrived; zero for dedup.StateNew.
	Reason DuplicateReason
	// Start and End bound the call to the store that claimed the key (on
	// the transactional path: the begin and claim of the batch's keys in
	// the last transaction the message ran in); both are zero for a
	// duplicate of a key earlier in the same batch, which is settled
	// without a claim of its own.
	Start, End time.Time
	// Messages is the number of messages whose keys that call claimed
	// together: all the messages of the transaction on the transactional
	// path (HookTx reports that claim once), 1 on the lease path, 0 when
	// Start is zero.
	Messages int
}

// HookClaimed is called once per message whose key was claimed: for every
// duplicate (as many calls as Stats.Duplicates counts), and for every new
// key whose handler went on to run. It is called when the message is
// settled, after the claim, so ClaimInfo carries the claim's own timing.
type HookClaimed interface {
	OnClaimed(ctx context.Context, m *Message, c ClaimInfo)
}

// HookHandlerStart is called right before a handler runs (every attempt).
// The context it returns is the handler's context; it must be derived from
// ctx (for example with a child span), or be ctx itself.
type HookHandlerStart interface {
	OnHandlerStart(ctx context.Context, m *Message) context.Context
}

// HookHandlerEnd is called right after a handler returned, with how long it
// ran and its error (nil on success; a panic is a *PanicError). ctx is the
// handler's context, as HookHandlerStart returned it.
type HookHandlerEnd interface {
	OnHandlerEnd(ctx context.Context, m *Message, d time.Duration, err error)
}

// CommitInfo describes the write that made a message's effect durable.
type CommitInfo struct {
	// Start and End bound the commit (the transaction's commit, or marking
	// the key done on the lease path). A batch's messages share one commit.
	Start, End time.Time
	// Err is the commit's error; nil when it succeeded.
	Err error
	// Messages is the number of messages the commit covered: the new
	// messages of the transaction on the transactional path (HookTx
	// reports that commit once), 1 on the lease path.
	Messages int
}

// HookCommit is called once per message for each write that was to make its
// effect durable: marking its key done (lease path), or committing the
// transaction that holds its record and its handler's writes (transactional
// path; every new message of the transaction gets the same CommitInfo). A
// failed commit is reported with its error; a transactional batch rerun after
// a refused commit reports its messages' next commit again, so each message
// gets at most one successful commit event. A transaction rolled back before
// its commit (a handler failed) reports none.
type HookCommit interface {
	OnCommit(ctx context.Context, m *Message, c CommitInfo)
}

// TxInfo describes one transaction of the transactional path: the work
// done once for all of its messages.
type TxInfo struct {
	// Claimed holds the contexts of the messages whose keys the
	// transaction claimed (the contexts HookReceived returned), in batch
	// order. ClaimStart and ClaimEnd bound the begin and claim of their
	// keys, and ClaimErr is its error (nil when it succeeded).
	Claimed              []context.Context
	ClaimStart, ClaimEnd time.Time
	ClaimErr             error
	// New holds the contexts of the messages claimed as new: the ones the
	// handler ran over (or was to) and the commit covered.
	New []context.Context
	// HandlerStart, HandlerEnd and HandlerErr describe the one call of a
	// batch handler (TransactionalBatch) over New; they are zero when
	// the handler runs per message (each call is reported to
	// HookHandlerStart and HookHandlerEnd) or was not called.
	HandlerStart, HandlerEnd time.Time
	HandlerErr               error
	// Commit is the transaction's commit, as HookCommit gets it for each
	// of New; zero when the transaction ended before committing (the
	// claim or a handler failed, or no message was new).
	Commit CommitInfo
}

// HookTx is called once per transaction of the transactional path, on the
// lane's goroutine, after the transaction ended (committed or rolled back)
// and before its messages are settled; ctx is the lane's context. It lets a
// tracing hook make one span per transaction for the claim, a batch
// handler's call and the commit, linked to the spans of the transaction's
// messages, instead of one per message (OpenTelemetry's messaging
// conventions for batches). The per-message events are reported as well,
// except that a hook implementing HookTx is not called with HookHandlerStart
// and HookHandlerEnd for the messages of a batch handler call over more than
// one message: TxInfo reports that call. The slices of t are valid during
// the call only.
type HookTx interface {
	OnTx(ctx context.Context, t TxInfo)
}

// AckInfo describes one Source.Ack call of the runner: the messages it
// acknowledged (one call may cover several, coalesced off the workers'
// path), when it started and ended, and its error. Messages is the
// runner's slice: read it during the call only.
type AckInfo struct {
	Messages   []*Message
	Start, End time.Time
	Err        error
}

// HookAck is told about every Source.Ack call, with its messages, timing
// and error. A failed ack of n messages adds n to Stats.AckFailures. It is
// called from the runner's acknowledging goroutine; an implementation must
// be safe for concurrent use and return quickly.
type HookAck interface {
	OnAck(ctx context.Context, a AckInfo)
}

// RetryKind tells why a message is handed back for a later attempt.
type RetryKind int

// Retry kinds.
const (
	// RetryHandler: the handler failed; the attempt counts towards
	// RetryPolicy.MaxAttempts.
	RetryHandler RetryKind = iota + 1
	// RetryInfrastructure: not the message's fault (the store failed,
	// another worker holds the key, an earlier message of its partition
	// failed); no attempt is counted and it is never dead-lettered for it.
	RetryInfrastructure
)

// String returns "handler" or "infrastructure".
func (k RetryKind) String() string { return nameOf(k, "handler", "infrastructure") }

// nameOf returns the name of v, an enumeration counted from 1 in the order
// of names, or "unknown".
func nameOf[E ~int](v E, names ...string) string {
	if v < 1 || int(v) > len(names) {
		return "unknown"
	}
	return names[v-1]
}

// HookRetry is called once per message the runner hands back for a later
// attempt, before Source.Retry or Release (Stats.Retried counts those the
// source accepted).
type HookRetry interface {
	OnRetry(ctx context.Context, m *Message, kind RetryKind, delay time.Duration, err error)
}

// DeadLetterReason classifies why a message was dead-lettered.
type DeadLetterReason string

// Dead-letter reasons, from the error that sent the message there.
const (
	DeadLetterMaxAttempts DeadLetterReason = "max_attempts"     // ErrMaxAttempts
	DeadLetterMismatch    DeadLetterReason = "payload_mismatch" // ErrPayloadMismatch
	DeadLetterMissingKey  DeadLetterReason = "missing_key"      // ErrMissingKey
	DeadLetterInvalidKey  DeadLetterReason = "invalid_key"      // ErrInvalidKey
	DeadLetterOversized   DeadLetterReason = "oversized"        // ErrOversized
	DeadLetterMalformed   DeadLetterReason = "malformed"        // ErrMalformed
	DeadLetterPermanent   DeadLetterReason = "permanent"        // Permanent, and anything else
)

// deadLetterReason classifies the cause of a dead letter.
func deadLetterReason(cause error) DeadLetterReason {
	switch {
	case errors.Is(cause, ErrMaxAttempts):
		return DeadLetterMaxAttempts
	case errors.Is(cause, ErrPayloadMismatch):
		return DeadLetterMismatch
	case errors.Is(cause, ErrMissingKey):
		return DeadLetterMissingKey
	case errors.Is(cause, ErrInvalidKey):
		return DeadLetterInvalidKey
	case errors.Is(cause, ErrOversized):
		return DeadLetterOversized
	case errors.Is(cause, ErrMalformed):
		return DeadLetterMalformed
	}
	return DeadLetterPermanent
}

// HookDeadLetter is called once per message the source accepted into its
// dead-letter route (as many calls as Stats.DeadLettered counts).
type HookDeadLetter interface {
	OnDeadLetter(ctx context.Context, m *Message, reason DeadLetterReason, err error)
}

// HookLeaseLost is called when the lease path finds a message's lease lost
// (another worker may own the key): while the handler ran, or while the
// message waited in its batch.
type HookLeaseLost interface {
	OnLeaseLost(ctx context.Context, m *Message, err error)
}

// HookLeaseRefreshFailed is called when refreshing a lease failed for another
// reason than losing it (the lease store is unreachable); the refresh is
// retried on the next tick.
type HookLeaseRefreshFailed interface {
	OnLeaseRefreshFailed(ctx context.Context, err error)
}

// SettleInfo describes how a message was settled.
type SettleInfo struct {
	Outcome Outcome
	// BatchSize is the number of messages in the message's batch.
	BatchSize int
	// Err is the error that decided the outcome (the handler's, the
	// store's), or the failed acknowledgement's for OutcomeHandled and
	// OutcomeDuplicate; nil otherwise.
	Err error
}

// HookSettled is called exactly once per received message, last of its
// events: when it was acknowledged (after Source.Ack returned), handed back,
// dead-lettered, or left to the broker. A tracing hook ends the message's span
// here.
type HookSettled interface {
	OnSettled(ctx context.Context, m *Message, s SettleInfo)
}

// observer reports a Runner's events to the Config.Hooks that implement
// each of them, resolved once in NewRunner. Its methods do nothing, and
// cost no allocation, when no hook wants the event; it is safe for
// concurrent use (it is read-only after resolveHooks).
type observer struct {
	received     []HookReceived
	batch        []HookBatch
	claimed      []HookClaimed
	handlerStart []HookHandlerStart
	handlerEnd   []HookHandlerEnd
	// The handler hooks called for the messages of a batch handler call
	// over more than one message: the ones that do not implement HookTx.
	batchStart  []HookHandlerStart
	batchEnd    []HookHandlerEnd
	tx          []HookTx
	commit      []HookCommit
	ack         []HookAck
	retry       []HookRetry
	deadLetter  []HookDeadLetter
	leaseLost   []HookLeaseLost
	refreshFail []HookLeaseRefreshFailed
	settled     []HookSettled
	// timed: a hook reports when a claim, a commit or a transaction
	// happened (HookClaimed, HookCommit, HookTx), so the paths read the
	// time (see now).
	timed bool
}

func resolveHooks(hs []Hook) observer {
	var h observer
	for _, x := range hs {
		collect(&h.received, x)
		collect(&h.batch, x)
		collect(&h.claimed, x)
		isTx := collect(&h.tx, x)
		if collect(&h.handlerStart, x) && !isTx {
			collect(&h.batchStart, x)
		}
		if collect(&h.handlerEnd, x) && !isTx {
			collect(&h.batchEnd, x)
		}
		collect(&h.commit, x)
		collect(&h.ack, x)
		collect(&h.retry, x)
		collect(&h.deadLetter, x)
		collect(&h.leaseLost, x)
		collect(&h.refreshFail, x)
		collect(&h.settled, x)
	}
	h.timed = len(h.claimed) > 0 || len(h.tx) > 0 || len(h.commit) > 0
	return h
}

func collect[H any](hs *[]H, x Hook) bool {
	v, ok := x.(H)
	if ok {
		*hs = append(*hs, v)
	}
	return ok
}

// duplicateReason guesses why j is a duplicate; see DuplicateReason.
func duplicateReason(j *job) DuplicateReason {
	switch {
	case j.follower:
		return DuplicateConcurrent
	case j.msg.Redelivered || j.msg.Attempt > 1:
		return DuplicateRedelivery
	}
	return DuplicateProducer
}

// overlay is a context with the cancellation and values of its Context and,
// first, the values of vals: the handler's context seen through the
// message's context (see HookReceived).
type overlay struct {
	context.Context
	vals context.Context
}

func (c overlay) Value(k any) any {
	if v := c.vals.Value(k); v != nil {
		return v
	}
	return c.Context.Value(k)
}

func (obs *observer) onSettled(j *job, o Outcome, size int, err error) {
	for _, h := range obs.settled {
		h.OnSettled(j.ctx, j.msg, SettleInfo{Outcome: o, BatchSize: size, Err: err})
	}
}

func (obs *observer) onClaimed(j *job) {
	if len(obs.claimed) == 0 {
		return
	}
	rec := j.claim
	c := ClaimInfo{Start: rec.start, End: rec.end, Messages: rec.n}
	switch {
	case j.out == outDuplicate:
		c.State, c.Reason = dedup.StateDone, duplicateReason(j)
	case (rec.isNew && !isHeldBehind(j.err)) || j.out == outAck:
		c.State = dedup.StateNew
	default:
		return
	}
	for _, h := range obs.claimed {
		h.OnClaimed(j.ctx, j.msg, c)
	}
}

func (obs *observer) onRefreshFailed(ctx context.Context, err error) {
	for _, h := range obs.refreshFail {
		h.OnLeaseRefreshFailed(ctx, err)
	}
}

func (obs *observer) onRetry(j *job, kind RetryKind, delay time.Duration) {
	for _, h := range obs.retry {
		h.OnRetry(j.ctx, j.msg, kind, delay, j.err)
	}
}

func (obs *observer) onDeadLetter(j *job, cause error) {
	if len(obs.deadLetter) == 0 {
		return
	}
	reason := deadLetterReason(cause)
	for _, h := range obs.deadLetter {
		h.OnDeadLetter(j.ctx, j.msg, reason, cause)
	}
}

// Outcome is how the runner settled a message (see HookSettled).
type Outcome int

// Outcomes.
const (
	// OutcomeHandled: the handler ran, its effect is durable, and the
	// message was acknowledged (or the ack failed; see SettleInfo.Err).
	OutcomeHandled Outcome = iota + 1
	// OutcomeDuplicate: the key was processed before; acknowledged.
	OutcomeDuplicate
	// OutcomeRetried: handed back for a later attempt.
	OutcomeRetried
	// OutcomeDeadLettered: moved to the dead-letter route.
	OutcomeDeadLettered
	// OutcomeLeft: left to the broker, which redelivers it (a failed
	// Retry or DeadLetter, a drain cut short, nothing decided).
	OutcomeLeft
)

// String returns the outcome's name: "handled", "duplicate", "retried",
// "dead_lettered" or "left".
func (o Outcome) String() string {
	return nameOf(o, "handled", "duplicate", "retried", "dead_lettered", "left")
}
