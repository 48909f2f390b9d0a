package consumer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/cfgerr"
)

// Log attribute keys used by the runner.
const (
	LogKeyConsumer = "consumer"
	LogKeyKey      = "key"
	LogKeyID       = "message_id"
	LogKeyTopic    = "topic"
	LogKeyAttempt  = "attempt"
	LogKeyError    = "err"
	LogKeyDelay    = "delay"
	LogKeyCount    = "count"
	LogKeyStored   = "stored_hash"
	LogKeyReceived = "received_hash"
	// LogKeySettleError is the error of a failed Retry or DeadLetter call,
	// logged beside the message's own error (LogKeyError).
	LogKeySettleError = "settle_err"
)

// ErrRunning is returned by Run when the Runner is already running.
var ErrRunning = errors.New("idemq: runner already running")

// Path is the way a Runner turns messages into effects: Transactional for
// effects in a database transaction, Leased for effects outside one. A Path
// is built once and used by one Runner.
type Path interface {
	// process decides the outcome of every job in batch. It must not return
	// before every job has an outcome, and it must only report outAck for a
	// job whose effect is durable. l is the lane the batch runs in: a path
	// may take the lane's next batch ahead (Runner.takeAhead) and leave an
	// open transaction for it in l.chain.
	process(ctx context.Context, r *Runner, batch []*job, l *lane)
	// validate reports a misconfigured path as a *idemq.ConfigError.
	validate() error
}

// outcome is what the runner does with a message once its path is done.
type outcome int

const (
	outNone       outcome = iota // not settled: left to the broker
	outAck                       // effect durable now (handler ran and committed)
	outDuplicate                 // effect was durable before; acknowledge
	outRetry                     // handler failed; retry with backoff or dead-letter
	outRetryInfra                // store or broker trouble; retry, never dead-letter
	outDeadLetter                // poison; dead-letter now
)

// job is one message moving through a Runner.
type job struct {
	msg    *Message
	key    string
	keyErr error // from Config.KeyFunc (or the source), checked by prepare
	hash   dedup.Hash

	out   outcome
	err   error
	delay time.Duration // for outRetryInfra, or from RetryAfter

	// failures is the key's handler failures as the store counted them (0:
	// not counted; the broker's Attempt applies).
	failures int

	// For hooks (see hooks.go). ctx is the message's context: the
	// receive context without its cancellation, or what HookReceived
	// returned.
	ctx                  context.Context
	follower             bool // the same key came earlier in the batch
	claimedNew           bool // the path claimed the key as new
	claimStart, claimEnd time.Time
	claimN               int // messages claimed with it (ClaimInfo.Messages)
}

func (j *job) set(o outcome, err error) { j.out, j.err = o, err }

// Runner receives messages from a Source, hands each to its Path, and settles
// it: acknowledge after the effect is durable, retry with backoff, or
// dead-letter. Create one with NewRunner; a Runner runs once at a time.
type Runner struct {
	src  Source
	path Path
	cfg  Config
	log  *slog.Logger

	running     atomic.Bool
	draining    atomic.Bool
	lastReceive atomic.Int64 // UnixNano of the last successful Receive
	stats       counters
	hooks       hooks

	// Consecutive failures of each dependency (see Health).
	receiveOut, storeOut, ackOut *outage
}

// NewRunner returns a Runner that reads from src and applies path. It validates
// cfg (after WithDefaults) and returns a *idemq.ConfigError for each invalid field
// of cfg and path, all at once (see idemq.ConfigError),
// including a Concurrency that the store's connection pool cannot serve
// (see dedup.PoolSizer): the pool must hold more connections than
// Concurrency. An unset Concurrency is lowered to one less than such a pool.
func NewRunner(src Source, path Path, cfg Config) (*Runner, error) {
	if src == nil {
		return nil, &idemq.ConfigError{Field: "Source", Reason: "nil"}
	}
	if path == nil {
		return nil, &idemq.ConfigError{Field: "Path", Reason: "nil"}
	}
	explicitConcurrency := cfg.Concurrency != 0
	cfg = cfg.WithDefaults()
	var bad cfgerr.List
	bad.Include(cfg.validate())
	bad.Include(path.validate())
	if err := bad.Err(); err != nil {
		return nil, err
	}
	if err := fitPool(path, &cfg, explicitConcurrency); err != nil {
		return nil, err
	}
	return &Runner{
		src:        src,
		path:       path,
		cfg:        cfg,
		log:        cfg.Logger.With(LogKeyConsumer, cfg.Name),
		receiveOut: newOutage(DependencyBroker, cfg),
		storeOut:   newOutage(DependencyStore, cfg),
		ackOut:     newOutage(DependencyBrokerAck, cfg),
		hooks:      resolveHooks(cfg.Hooks),
	}, nil
}

// Config returns the runner's configuration with defaults applied.
func (r *Runner) Config() Config { return r.cfg }

// Run receives and handles messages until ctx is done, then stops receiving,
// finishes the messages already received (committing and acknowledging them)
// within Config.DrainTimeout, and returns nil. Messages not settled by then stay
// unacknowledged and return to the broker. Run returns an error only if the
// source is closed underneath it (ErrClosed), the Runner is already running,
// or, before anything is received, the source's redelivery horizon exceeds
// the store's retention (a *idemq.ConfigError, see HorizonReporter).
//
// Run does not close the source; close it after Run returns.
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	defer r.draining.Store(false)
	if err := r.checkRetention(ctx); err != nil {
		return err
	}
	r.logStart(ctx)

	// Work outlives ctx during the drain, and is cancelled when the drain
	// times out.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()

	lanes := make([]chan *job, r.cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range lanes {
		lanes[i] = make(chan *job, r.cfg.BatchSize+laneSlack)
		wg.Go(func() { r.lane(workCtx, lanes[i]) })
	}

	err := r.receive(ctx, lanes)
	r.draining.Store(true)
	for _, l := range lanes {
		close(l)
	}

	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	timer := time.NewTimer(r.cfg.DrainTimeout)
	defer timer.Stop()
	select {
	case <-drained:
	case <-timer.C:
		r.log.LogAttrs(ctx, slog.LevelWarn, "drain timed out; unsettled messages return to the broker")
		cancelWork()
		<-drained
	}
	return err
}

// laneSlack is how many messages a lane queues beyond one batch. The
// receiver hands each message to the lane of its key and waits when that
// lane is full; with room for only one batch, one busy lane stalled the
// receiver while the other lanes ran dry (docs/performance.md).
// A few messages per lane keep every lane fed; they are received, not
// started, and a drain still finishes them (within Config.DrainTimeout).
const laneSlack = 16

// mctxKey marks a message's base context (see receive).
type mctxKey struct{}

// receive pulls messages from the source and dispatches them to lanes until
// ctx is done.
func (r *Runner) receive(ctx context.Context, lanes []chan *job) error {
	max := r.cfg.BatchSize * r.cfg.Concurrency
	// A message's context: values only. The value on top makes lookups
	// walk the chain inside the context package, which does not allocate
	// where calling WithoutCancel's Value method directly does (hooks look
	// up values in it for every message).
	mctx := context.WithValue(context.WithoutCancel(ctx), mctxKey{}, true)
	for ctx.Err() == nil {
		if !r.awaitStore(ctx) {
			return nil
		}
		msgs, err := r.src.Receive(ctx, max)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrClosed) {
				return err
			}
			r.stats.receiveFailures.Add(1)
			delay := min(r.cfg.Retry.Backoff(r.receiveOut.failed(ctx, r.log, err)), outageProbe)
			r.receiveOut.warn(ctx, r.log, "receive failed", slog.Any(LogKeyError, err), slog.Duration(LogKeyDelay, delay))
			sleep(ctx, delay)
			continue
		}
		r.lastReceive.Store(time.Now().UnixNano())
		r.receiveOut.ok(ctx, r.log)
		for _, m := range msgs {
			r.stats.received.Add(1)
			j := &job{msg: m, ctx: mctx}
			for _, h := range r.hooks.received {
				j.ctx = h.OnReceived(j.ctx, m)
			}
			j.key, j.keyErr = r.keyOf(m)
			select {
			case lanes[r.laneOf(j)] <- j:
			case <-ctx.Done():
				// Stopping while a lane is full: what was not handed to a
				// lane stays unacknowledged and returns to the broker.
				r.hookSettled(j, OutcomeLeft, 0, nil)
				return nil
			}
		}
	}
	return nil
}

// keyOf returns the deduplication key of m from Config.KeyFunc. A key the
// source could not read (Message.KeyErr) and a KeyFunc that panics give an
// error wrapping ErrMissingKey (and, for a panic, a *PanicError), so that one
// malformed message is dead-lettered instead of crashing the process.
func (r *Runner) keyOf(m *Message) (key string, err error) {
	if m.KeyErr != nil {
		return "", fmt.Errorf("%w: the source could not read it: %w", ErrMissingKey, m.KeyErr)
	}
	defer func() {
		if v := recover(); v != nil {
			key, err = "", fmt.Errorf("%w: KeyFunc: %w", ErrMissingKey, &PanicError{Value: v, Stack: debug.Stack()})
		}
	}()
	return r.cfg.KeyFunc(m)
}

// laneOf picks the lane of a job: by partition key, else by deduplication key,
// so that ordered messages and duplicates of one key are handled serially.
func (r *Runner) laneOf(j *job) int {
	if r.cfg.Concurrency == 1 {
		return 0
	}
	s := j.msg.PartitionKey
	if s == "" {
		s = j.key
	}
	h := fnv.New32a()
	h.Write([]byte(s))
	return int(h.Sum32() % uint32(r.cfg.Concurrency))
}

// lane handles the jobs of one lane in batches of up to BatchSize. Its
// acknowledgements go through an acker of its own, so that the lane handles
// its next batch while the broker confirms the last; lane returns once the
// acker has sent them all.
func (r *Runner) lane(ctx context.Context, in <-chan *job) {
	a := r.startAcker(ctx)
	defer a.stop()
	l := &lane{in: in}
	defer l.abandon(ctx) // nothing is chained once the last batch ran; a safety net
	buf := make([]*job, 0, r.cfg.BatchSize)
	for {
		b := l.ahead
		l.ahead = nil
		if b == nil {
			j, ok := <-in
			if !ok {
				return
			}
			batch := r.fill(append(buf[:0], j), in)
			if len(batch) < r.cfg.BatchSize && r.cfg.BatchWait > 0 {
				batch = r.fillWithin(batch, in, r.cfg.BatchWait)
			}
			if r.leftOnDrain(ctx, batch) {
				continue
			}
			b = r.prepareBatch(ctx, batch)
		} else if r.leftOnDrain(ctx, b.batch) {
			l.abandon(ctx)
			continue
		}
		r.handle(ctx, b, a, l)
	}
}

// lane is what one lane carries from one batch to the next: the batch it
// took ahead while committing the last one, and the open transaction that
// commit chained and that already claimed that batch's keys.
type lane struct {
	in    <-chan *job
	cur   *prepared // the batch being handled
	ahead *prepared
	chain chained
}

// chained is a path's open transaction for the batch a lane took ahead.
type chained interface {
	// abandon rolls the transaction back.
	abandon(ctx context.Context)
}

// abandon rolls back the transaction chained for the batch taken ahead, if
// any.
func (l *lane) abandon(ctx context.Context) {
	if l.chain != nil {
		l.chain.abandon(ctx)
		l.chain = nil
	}
}

// takeAhead takes the lane's next batch without waiting, for a commit to
// chain its claim to, and prepares it; the lane handles it next. It takes
// nothing when no job is queued, when batches wait to fill (BatchWait) or
// when the Runner is stopping.
func (r *Runner) takeAhead(ctx context.Context, l *lane) *prepared {
	if l.ahead != nil || (r.cfg.BatchWait > 0 && r.cfg.BatchSize > 1) || ctx.Err() != nil {
		return nil
	}
	var j *job
	select {
	case next, ok := <-l.in:
		if !ok {
			return nil
		}
		j = next
	default:
		return nil
	}
	l.ahead = r.prepareBatch(ctx, r.fill(append(make([]*job, 0, r.cfg.BatchSize), j), l.in))
	return l.ahead
}

// fill adds the jobs queued in in to batch, without waiting, until it holds
// BatchSize.
func (r *Runner) fill(batch []*job, in <-chan *job) []*job {
	for len(batch) < r.cfg.BatchSize {
		select {
		case j, ok := <-in:
			if !ok {
				return batch
			}
			batch = append(batch, j)
		default:
			return batch
		}
	}
	return batch
}

// leftOnDrain reports whether the Runner's drain timed out, leaving batch to
// the broker.
func (r *Runner) leftOnDrain(ctx context.Context, batch []*job) bool {
	if ctx.Err() == nil {
		return false
	}
	for _, j := range batch {
		r.hookSettled(j, OutcomeLeft, len(batch), nil)
	}
	return true
}

// fillWithin adds jobs from in to batch until it holds BatchSize, wait has
// passed or in is closed (the Runner is draining: what is queued is
// handled at once).
func (r *Runner) fillWithin(batch []*job, in <-chan *job, wait time.Duration) []*job {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for len(batch) < r.cfg.BatchSize {
		select {
		case j, ok := <-in:
			if !ok {
				return batch
			}
			batch = append(batch, j)
		case <-timer.C:
			return batch
		}
	}
	return batch
}

// prepared is a batch ready for its path: the jobs to run (live, one per
// key) and the later copies of their keys (followers), settled after them.
// The jobs with bad input already have their outcome.
type prepared struct {
	batch, live, followers []*job
	leaders                map[string]*job
}

// prepareBatch validates a batch's jobs and splits it for its path. It
// calls the HookBatch hooks.
func (r *Runner) prepareBatch(ctx context.Context, batch []*job) *prepared {
	for _, h := range r.hooks.batch {
		h.OnBatch(ctx, len(batch))
	}
	b := &prepared{batch: batch, live: make([]*job, 0, len(batch)), leaders: make(map[string]*job, len(batch))}
	for _, j := range batch {
		if err := r.prepare(j); err != nil {
			// A key no store can hold must not travel into the dead
			// letter's headers either.
			j.key = ""
			j.set(outDeadLetter, err)
			continue
		}
		if b.leaders[j.key] != nil {
			// The same key twice in one batch: settle it after its leader.
			j.follower = true
			b.followers = append(b.followers, j)
			continue
		}
		b.leaders[j.key] = j
		b.live = append(b.live, j)
	}
	return b
}

// handle runs a prepared batch's path and settles every message.
func (r *Runner) handle(ctx context.Context, b *prepared, a *acker, l *lane) {
	if l != nil {
		l.cur = b
	}
	if len(b.live) > 0 {
		r.path.process(ctx, r, b.live, l)
		r.storeOut.report(ctx, r.log, infraErr(b.live))
	}
	for _, f := range b.followers {
		leader := b.leaders[f.key]
		switch {
		case leader.out != outAck && leader.out != outDuplicate:
			f.set(outRetryInfra, fmt.Errorf("idemq: duplicate of key %q in the same batch is retried after its first copy: %w", f.key, errDuplicateUnsettled))
		case f.hash != leader.hash:
			f.set(outDeadLetter, &dedup.MismatchError{Scope: r.cfg.Name, Key: f.key, Stored: leader.hash, Received: f.hash})
		default:
			f.set(outDuplicate, nil)
		}
	}
	r.settle(ctx, b.batch, a)
}

var errDuplicateUnsettled = errors.New("first copy not settled")

// prepare computes a job's key and digest and rejects bad input.
func (r *Runner) prepare(j *job) error {
	if max := r.cfg.MaxMessageBytes; max > 0 && len(j.msg.Body) > max {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrOversized, len(j.msg.Body), max)
	}
	if j.key == "" && j.keyErr == nil {
		j.key, j.keyErr = r.keyOf(j.msg) // not computed on receipt
	}
	if err := j.keyErr; err != nil {
		if errors.Is(err, ErrMissingKey) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrMissingKey, err)
	}
	if j.key == "" {
		return ErrMissingKey
	}
	if err := validKey(j.key); err != nil {
		return err
	}
	j.hash = dedup.HashPayload(j.msg.Body)
	return nil
}

// MaxKeyBytes is the longest deduplication key accepted; longer keys are
// dead-lettered with ErrInvalidKey. It keeps a key (with its scope) well
// inside a PostgreSQL index entry.
const MaxKeyBytes = 1024

// validKey rejects keys that no store or downstream header can carry: too
// long, not UTF-8, or holding a control character (NUL, CR, LF, TAB, DEL,
// the C1 range), which would also break an Idempotency-Key header.
func validKey(key string) error {
	switch {
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidKey, len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	if i := strings.IndexFunc(key, unicode.IsControl); i >= 0 {
		c, _ := utf8.DecodeRuneInString(key[i:])
		return fmt.Errorf("%w: control character %U at byte %d", ErrInvalidKey, c, i)
	}
	return nil
}

// infraDelay counts a failure of the store and returns the retry delay,
// growing with the run of such failures (not with the message's attempts,
// which these failures do not count) up to outageProbe, so that the
// messages sent back come again soon after the store answers; while the
// outage lasts, receiving is paused (awaitStore). handle logs the outage
// once it lasts.
func (r *Runner) infraDelay() time.Duration {
	return min(r.cfg.Retry.Backoff(r.storeOut.fail()), outageProbe)
}

// infraOK ends a run of store failures.
func (r *Runner) infraOK() { r.storeOut.succeed() }

// infraErr returns the error of the first job of batch that the store's
// trouble sent back, for the outage log. Jobs sent back for reasons of their
// own (another worker holds the key, an unsettled copy in the batch) are not
// the store's trouble.
func infraErr(batch []*job) error {
	for _, j := range batch {
		if j.out == outRetryInfra && j.err != nil && !errors.Is(j.err, errKeyBusy) && !errors.Is(j.err, errDuplicateUnsettled) {
			return j.err
		}
	}
	return nil
}

// errKeyBusy is wrapped by the retry reason of a message whose key another
// worker holds (lease path).
var errKeyBusy = errors.New("being handled by another worker")

// settle retries or dead-letters the jobs of a batch that failed and hands
// those to acknowledge (handled and duplicates) to the lane's acker. Once ctx
// is cancelled (the drain timed out) nothing is retried or dead-lettered: a
// handler cut short by the shutdown did not fail, so its message is left to
// the broker without counting an attempt.
func (r *Runner) settle(ctx context.Context, batch []*job, a *acker) {
	var acks []*job
	for _, j := range batch {
		r.hookClaimed(j)
		if ctx.Err() != nil && j.out != outAck && j.out != outDuplicate && j.out != outNone {
			r.stats.left.Add(1)
			r.log.LogAttrs(r.msgCtx(ctx, j), slog.LevelInfo, "stopping: message left to the broker",
				slog.String(LogKeyKey, j.key), slog.String(LogKeyID, j.msg.ID), slog.Int(LogKeyAttempt, j.msg.Attempt),
				slog.Any(LogKeyError, j.err))
			r.hookSettled(j, OutcomeLeft, len(batch), j.err)
			continue
		}
		switch j.out {
		case outAck:
			r.stats.handled.Add(1)
			acks = append(acks, j)
		case outDuplicate:
			r.stats.duplicates.Add(1)
			r.log.LogAttrs(r.msgCtx(ctx, j), slog.LevelDebug, "duplicate acknowledged",
				slog.String(LogKeyKey, j.key), slog.String(LogKeyID, j.msg.ID), slog.Int(LogKeyAttempt, j.msg.Attempt))
			acks = append(acks, j)
		case outRetry, outRetryInfra:
			r.hookSettled(j, r.retry(ctx, j), len(batch), j.err)
		case outDeadLetter:
			r.hookSettled(j, r.deadLetter(ctx, j, j.err), len(batch), j.err)
		case outNone:
			r.hookSettled(j, OutcomeLeft, len(batch), nil)
		}
	}
	if len(acks) > 0 {
		a.send(ackBatch{jobs: acks, size: len(batch)})
	}
}

// msgCtx returns ctx seen through the message context of j when a
// HookReceived may have given it values (a span, so that a trace-aware log
// handler ties a line to the message, and the handler's spans join it).
// Without such hooks it is ctx itself.
func (r *Runner) msgCtx(ctx context.Context, j *job) context.Context {
	if len(r.hooks.received) == 0 || j.ctx == nil {
		return ctx
	}
	return overlay{Context: ctx, vals: j.ctx}
}

// retry hands j back for a later attempt, or dead-letters it once its
// attempts are exhausted, and returns the outcome.
func (r *Runner) retry(ctx context.Context, j *job) Outcome {
	m := j.msg
	ctx = r.msgCtx(ctx, j)
	var delay time.Duration
	kind := RetryHandler
	switch {
	case j.out == outRetryInfra:
		// Not the message's fault: never dead-letter for it.
		delay = j.delay
		if delay <= 0 {
			delay = r.cfg.Retry.Backoff(1)
		}
		kind = RetryInfrastructure
	case r.countFailure(ctx, j) >= r.cfg.Retry.MaxAttempts:
		return r.deadLetter(ctx, j, fmt.Errorf("%w after %d attempts: %w", ErrMaxAttempts, j.attempt(), j.err))
	default:
		delay = r.backoff(j)
	}
	r.stats.retried.Add(1)
	r.log.LogAttrs(ctx, slog.LevelInfo, "message will be retried", slog.String(LogKeyKey, j.key), slog.String(LogKeyID, m.ID),
		slog.String(LogKeyTopic, m.Topic), slog.Int(LogKeyAttempt, j.attempt()), slog.Duration(LogKeyDelay, delay),
		slog.Any(LogKeyError, j.err))
	for _, h := range r.hooks.retry {
		h.OnRetry(j.ctx, m, kind, delay, j.err)
	}
	retry := r.src.Retry
	if rel, ok := r.src.(Releaser); ok && j.out == outRetryInfra {
		retry = rel.Release
	}
	if err := retry(ctx, m, delay); err != nil {
		r.stats.settleFailures.Add(1)
		r.log.LogAttrs(ctx, slog.LevelWarn, "retry failed; the broker will redeliver", slog.String(LogKeyID, m.ID), slog.Any(LogKeyError, err))
		return OutcomeLeft
	}
	return OutcomeRetried
}

// deadLetter hands j to the source's dead-letter route. Only a dead letter
// the source accepted is counted and logged as one. It returns the outcome.
func (r *Runner) deadLetter(ctx context.Context, j *job, cause error) Outcome {
	m := j.msg
	ctx = r.msgCtx(ctx, j)
	reason := &DeadLetterError{Key: j.key, Attempts: j.attempt(), Err: cause}
	attrs := []slog.Attr{slog.String(LogKeyKey, j.key), slog.String(LogKeyID, m.ID), slog.String(LogKeyTopic, m.Topic),
		slog.Int(LogKeyAttempt, j.attempt()), slog.Any(LogKeyError, cause)}
	var mm *dedup.MismatchError
	if errors.As(cause, &mm) {
		attrs = append(attrs, slog.String(LogKeyStored, mm.Stored.String()), slog.String(LogKeyReceived, mm.Received.String()))
	}
	if err := r.src.DeadLetter(ctx, m, reason); err != nil {
		r.stats.settleFailures.Add(1)
		r.stats.left.Add(1)
		r.log.LogAttrs(ctx, slog.LevelError, "dead-letter failed; the broker will redeliver",
			append(attrs, slog.Any(LogKeySettleError, err))...)
		return OutcomeLeft
	}
	r.stats.deadLettered.Add(1)
	if errors.Is(cause, ErrPayloadMismatch) {
		r.stats.mismatches.Add(1)
	}
	r.log.LogAttrs(ctx, slog.LevelError, "message dead-lettered", attrs...)
	if len(r.hooks.deadLetter) > 0 {
		reason := deadLetterReason(cause)
		for _, h := range r.hooks.deadLetter {
			h.OnDeadLetter(j.ctx, m, reason, cause)
		}
	}
	r.forgetFailures(ctx, j)
	return OutcomeDeadLettered
}

// call runs a handler with the key in its context, the handler timeout, and
// panic recovery.
func (r *Runner) call(ctx context.Context, j *job, fn func(ctx context.Context) error) (err error) {
	ctx = withKeys(r.msgCtx(ctx, j), r.cfg.Name, j.key)
	if r.cfg.HandlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.cfg.HandlerTimeout)
		defer cancel()
	}
	if len(r.hooks.handlerStart) > 0 || len(r.hooks.handlerEnd) > 0 {
		for _, h := range r.hooks.handlerStart {
			ctx = h.OnHandlerStart(ctx, j.msg)
		}
		start := time.Now()
		defer func() {
			d := time.Since(start)
			for _, h := range r.hooks.handlerEnd {
				h.OnHandlerEnd(ctx, j.msg, d, err)
			}
		}()
	}
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(ctx)
}

// backoff returns the delay before a failed job's next attempt: the one its
// handler asked for with RetryAfter, else the policy's. It is computed once
// per failure, so that messages held behind the job can wait as long.
func (r *Runner) backoff(j *job) time.Duration {
	if j.delay > 0 {
		return j.delay
	}
	if d, ok := retryDelay(j.err); ok {
		return d
	}
	return r.cfg.Retry.Backoff(j.attempt())
}

// failure classifies a handler error into an outcome.
func (r *Runner) failure(j *job, err error) {
	if IsPermanent(err) {
		j.set(outDeadLetter, err)
		return
	}
	j.set(outRetry, err)
	j.delay = r.backoff(j)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
