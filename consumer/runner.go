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

// ErrRunning is returned by Run when the Runner is already running.
var ErrRunning = errors.New("idemq: runner already running")

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
	lastReceive atomic.Int64           // UnixNano of the last successful Receive
	storeLoss   atomic.Pointer[string] // Health.StoreLoss, read when Run started
	stats       counters
	hooks       observer
	env         pathEnv // what the path gets (see Path)
	settler     settler

	// Consecutive failures of each dependency (see Health).
	receiveOut, storeOut, ackOut *outage
	settleOut                    *outage // the settler's
}

// NewRunner returns a Runner that reads from src and applies path. It validates
// cfg (after WithDefaults) and returns a *idemq.ConfigError for each invalid field
// of cfg and path, all at once (see idemq.ConfigError),
// including a Concurrency that the store's connection pool cannot serve
// (see dedupdriver.Caps.Pool): the pool must hold more connections than
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
	r := &Runner{
		src:        src,
		path:       path,
		cfg:        cfg,
		log:        cfg.Logger.With(LogKeyConsumer, cfg.Name),
		receiveOut: newOutage(DependencyBroker, cfg),
		storeOut:   newOutage(DependencyStore, cfg),
		ackOut:     newOutage(DependencyBrokerAck, cfg),
		settleOut:  newOutage(DependencyBrokerSettle, cfg),
		hooks:      resolveHooks(cfg.Hooks),
	}
	r.env = pathEnv{
		scope: cfg.Name, log: r.log, retry: cfg.Retry, handlerTimeout: cfg.HandlerTimeout, maxResultBytes: cfg.MaxResultBytes,
		stats: &r.stats, storeOut: r.storeOut, obs: &r.hooks, takeAhead: r.takeAhead,
	}
	r.settler = settler{env: &r.env, src: src, out: r.settleOut}
	if path.driverCaps().FailureCount {
		r.settler.counter = path.driver()
	}
	return r, nil
}

// Config returns the runner's configuration with defaults applied.
func (r *Runner) Config() Config { return r.cfg }

// Run receives and handles messages until ctx is done, then stops receiving,
// finishes the messages already received (committing and acknowledging them)
// within Config.DrainTimeout, and returns nil. Messages not settled by then stay
// unacknowledged and return to the broker. Run returns an error only if the
// source is closed underneath it (ErrClosed), the Runner is already running,
// or, before anything is received: the store (or a hook in Config.Hooks)
// reports that its tables do not exist (an error wrapping a
// *dedup.SchemaError, matching dedup.ErrNotMigrated: see
// dedup.SchemaChecker), or the source's redelivery horizon exceeds the
// store's retention (a *idemq.ConfigError, see HorizonReporter).
//
// Run also refuses to start when the store was told to refuse a server
// that can lose the records it acknowledged (an error matching
// dedup.ErrNotDurable, see dedupdriver.Caps.Durability).
//
// Run does not close the source; close it after Run returns.
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	defer r.draining.Store(false)
	if err := checkSchema(ctx, r.path, r.cfg, r.log); err != nil {
		return err
	}
	if err := checkRetention(ctx, r.src, r.path, r.log, r.cfg.AllowShortRetention); err != nil {
		return err
	}
	loss, err := storeDurability(ctx, r.path, r.log)
	if err != nil {
		return err
	}
	r.storeLoss.Store(&loss)
	logStart(ctx, r.log, r.cfg, r.src, r.path)

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

	err = r.receive(ctx, lanes)
	r.draining.Store(true)
	for _, l := range lanes {
		close(l)
	}

	// ctx is done: the lines of the drain are logged with its values.
	lctx := context.WithoutCancel(ctx)
	start := time.Now()
	r.log.LogAttrs(lctx, slog.LevelInfo, "stopping: draining the messages received",
		slog.Duration(LogKeyDrainTimeout, r.cfg.DrainTimeout))
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	timer := time.NewTimer(r.cfg.DrainTimeout)
	defer timer.Stop()
	select {
	case <-drained:
	case <-timer.C:
		r.log.LogAttrs(lctx, slog.LevelWarn, "drain timed out; unsettled messages return to the broker")
		cancelWork()
		<-drained
	}
	r.log.LogAttrs(lctx, slog.LevelInfo, "stopped", slog.Duration(LogKeyElapsed, time.Since(start).Round(time.Millisecond)))
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
			r.receiveOut.line(ctx, r.log, slog.LevelWarn, "receive failed", slog.Any(LogKeyError, err), slog.Duration(LogKeyDelay, delay))
			sleep(ctx, delay)
			continue
		}
		r.lastReceive.Store(time.Now().UnixNano())
		r.receiveOut.ok(ctx, r.log)
		for _, m := range msgs {
			j := &job{msg: m, ctx: mctx, seq: r.stats.received.Add(1)}
			for _, h := range r.hooks.received {
				j.ctx = h.OnReceived(j.ctx, m)
			}
			j.key, j.keyErr = r.keyOf(m)
			select {
			case lanes[r.laneOf(j)] <- j:
			case <-ctx.Done():
				// Stopping while a lane is full: what was not handed to a
				// lane stays unacknowledged and returns to the broker.
				r.hooks.onSettled(j, OutcomeLeft, 0, nil)
				return nil
			}
		}
	}
	return nil
}

// keyOf returns the deduplication key of m from Config.KeyFunc. A key the
// source could not read (Delivery.KeyErr) and a KeyFunc that panics give an
// error wrapping ErrMissingKey (and, for a panic, a *PanicError), so that one
// malformed message is dead-lettered instead of crashing the process.
func (r *Runner) keyOf(m *Message) (key string, err error) {
	if m.delivery.KeyErr != nil {
		return "", fmt.Errorf("%w: the source could not read it: %w", ErrMissingKey, m.delivery.KeyErr)
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
	a := startAcker(ctx, r.src, &r.env, r.ackOut)
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
			batch := r.fill(append(buf[:0], j), in, r.cfg.BatchWait)
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
	l.ahead = r.prepareBatch(ctx, r.fill(append(make([]*job, 0, r.cfg.BatchSize), j), l.in, 0))
	return l.ahead
}

// fill adds jobs from in to batch until it holds BatchSize or in is closed
// (the Runner is draining: what is queued is handled at once): the jobs
// queued and, with a wait, those that arrive within wait of the first
// that was not.
func (r *Runner) fill(batch []*job, in <-chan *job, wait time.Duration) []*job {
	var timeout <-chan time.Time // set once fill waits
	for len(batch) < r.cfg.BatchSize {
		var j *job
		ok := true
		select {
		case j, ok = <-in:
		default:
			if wait <= 0 {
				return batch
			}
			if timeout == nil {
				t := time.NewTimer(wait)
				defer t.Stop()
				timeout = t.C
			}
			select {
			case j, ok = <-in:
			case <-timeout:
				return batch
			}
		}
		if !ok {
			return batch
		}
		batch = append(batch, j)
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
		r.hooks.onSettled(j, OutcomeLeft, len(batch), nil)
	}
	return true
}

// prepareBatch validates a batch's jobs and splits it for its path. It
// calls the HookBatch hooks.
func (r *Runner) prepareBatch(ctx context.Context, batch []*job) *prepared {
	for _, h := range r.hooks.batch {
		h.OnBatch(ctx, len(batch))
	}
	b := &prepared{batch: batch}
	if len(batch) == 1 {
		b.live = b.one[:0]
	} else {
		b.live, b.leaders = make([]*job, 0, len(batch)), make(map[string]*job, len(batch))
	}
	for _, j := range batch {
		if err := r.prepare(j); err != nil {
			// A key no store can hold must not travel into the dead
			// letter's headers either; a valid one (an oversized body's)
			// goes with the message into its line and dead letter.
			if j.keyErr != nil || validKey(j.key) != nil {
				j.key = ""
			}
			j.set(outDeadLetter, err)
			continue
		}
		j.msg.keys = msgKeys{scope: r.cfg.Name, key: j.key} // for Message.KeyContext (batch handlers, hooks)
		if b.leaders != nil {
			if b.leaders[j.key] != nil {
				// The same key twice in one batch: settle it after its leader.
				j.follower = true
				b.followers = append(b.followers, j)
				continue
			}
			b.leaders[j.key] = j
		}
		b.live = append(b.live, j)
	}
	return b
}

// handle runs a prepared batch's path in the lane's partition order and
// settles every message.
func (r *Runner) handle(ctx context.Context, b *prepared, a *acker, l *lane) {
	l.cur = b
	b.live = l.order.admit(b.live)
	if len(b.live) > 0 {
		r.path.process(ctx, &r.env, b.live, l)
	}
	acks := r.settler.settle(ctx, b)
	l.order.settled(b.batch, r.stats.received.Load())
	if len(acks) > 0 {
		a.send(ackBatch{jobs: acks, size: len(b.batch)})
	}
}

// prepare computes a job's key and digest and rejects bad input.
func (r *Runner) prepare(j *job) error {
	if j.key == "" && j.keyErr == nil {
		j.key, j.keyErr = r.keyOf(j.msg) // not computed on receipt
	}
	if max := r.cfg.MaxMessageBytes; max > 0 && len(j.msg.Body) > max {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrOversized, len(j.msg.Body), max)
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
	if fp := j.msg.Fingerprint; fp != nil {
		j.hash = dedup.HashPayload(fp)
	} else {
		j.hash = dedup.HashPayload(j.msg.Body)
	}
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

// Health returns the runner's current health. It is safe to call at any time
// from any goroutine. A readiness probe serves Ready; the counts say which
// dependency is at fault, and the same outages are logged (ERROR when they
// reach Config.OutageThreshold, INFO when they end).
//
// A broker that is down without failing Receive (a client that keeps
// retrying inside a blocking call) shows as a LastReceive that stops
// advancing while messages are expected.
func (r *Runner) Health() Health {
	h := Health{
		Running:         r.running.Load(),
		Draining:        r.draining.Load(),
		ReceiveFailures: r.receiveOut.streakLen(),
		StoreFailures:   r.storeOut.streakLen(),
		AckFailures:     r.ackOut.streakLen(),
		SettleFailures:  r.settleOut.streakLen(),
	}
	if ns := r.lastReceive.Load(); ns != 0 {
		h.LastReceive = time.Unix(0, ns)
	}
	if l := r.storeLoss.Load(); l != nil {
		h.StoreLoss = *l
	}
	t := r.cfg.OutageThreshold
	h.Ready = h.Running && !h.Draining && h.ReceiveFailures < t && h.StoreFailures < t && h.AckFailures < t
	return h
}

// Stats returns a snapshot of the runner's counters. It is safe to call at any
// time from any goroutine.
func (r *Runner) Stats() Stats { return r.stats.snapshot() }

// WaitIdle blocks until the runner has received and settled every message
// it received, and nothing new for idle, then returns nil; it returns
// ctx.Err() if ctx is done first. Use it to drain a queue and stop, in batch
// jobs, tools and tests:
//
//	go func() {
//		if runner.WaitIdle(ctx, 3*time.Second) == nil {
//			cancel() // the context passed to Run
//		}
//	}()
//
// A message retried with a delay longer than idle comes back after WaitIdle
// returned. It is safe to call from any goroutine.
func (r *Runner) WaitIdle(ctx context.Context, idle time.Duration) error {
	return r.stats.waitIdle(ctx, idle)
}

// awaitStore holds the receive loop while the store's outage is declared
// (back-pressure, see Config.OutageThreshold), probing the store every
// outageProbe until it answers; the next message handled then ends the
// outage or, failing, pauses receiving again. It returns false when ctx is
// done.
func (r *Runner) awaitStore(ctx context.Context) bool {
	if !r.storeOut.down() {
		return true
	}
	if r.storeOut.pause() { // once per outage: it pauses again after each failed try
		r.log.LogAttrs(ctx, slog.LevelInfo, "receiving paused until the store answers",
			slog.String(LogKeyDependency, DependencyStore), slog.Duration(LogKeyDelay, outageProbe))
	}
	for ctx.Err() == nil && r.storeOut.down() {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := r.path.probe(pctx, r.cfg.Name)
		cancel()
		switch {
		case ctx.Err() != nil:
		case err == nil:
			r.storeOut.probed()
		default:
			r.storeOut.failed(ctx, r.log, err)
			sleep(ctx, outageProbe)
		}
	}
	return ctx.Err() == nil
}

// fitPool checks cfg.Concurrency against the connection pool of path's
// store, which must be larger (its error says why). An unset Concurrency
// (explicit is false) is lowered to fit instead of failing.
func fitPool(path Path, cfg *Config, explicit bool) error {
	size := path.poolSize()
	if size <= 0 || cfg.Concurrency < size {
		return nil
	}
	if !explicit && size >= 2 {
		cfg.Concurrency = size - 1
		return nil
	}
	return &idemq.ConfigError{Field: "Concurrency", Reason: fmt.Sprintf(
		"%d lanes need a connection pool of at least %d connections (one per lane, each held for its whole transaction, "+
			"plus at least one for the handler's queries outside its transaction and the retention janitor); "+
			"the store's pool has %d: raise the pool size (pgxpool: pool_max_conns or Config.MaxConns; "+
			"database/sql: SetMaxOpenConns) or lower Concurrency", cfg.Concurrency, cfg.Concurrency+1, size)}
}
