package consumer

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/internal/cfgerr"
)

// Path is the way a Runner turns messages into effects: Transactional for
// effects in a database transaction, Leased for effects outside one. A Path
// is built once and used by one Runner.
type Path interface {
	// process decides the outcome of every job in batch. It must not return
	// before every job has an outcome, and it must only report outAck for a
	// job whose effect is durable. env is all it gets from the Runner. l is
	// the lane the batch runs in: a path may take the lane's next batch
	// ahead (env.takeAhead) and leave an open transaction for it in l.chain.
	process(ctx context.Context, env *pathEnv, batch []*job, l *lane)
	// validate reports a misconfigured path as a *ConfigError.
	validate() error
	// driverCaps returns what the path's store driver can do; the Runner
	// asks it instead of looking for optional interfaces, so that a store
	// wrapper that forwards the driver keeps the Runner on the same paths.
	driverCaps() dedupdriver.Caps
	// driver returns the store's driver, which counts handler failures
	// when driverCaps().FailureCount is set and checks the schema when
	// driverCaps().SchemaCheck is.
	driver() dedupdriver.Common
	// poolSize returns the size of the connection pool the path's
	// transactions draw on, 0 when unknown or unlimited.
	poolSize() int
	// retention returns how long the path's store remembers a processed
	// key, and false if it cannot tell.
	retention() (time.Duration, bool)
	// probe checks that the store answers, without touching any message's
	// record.
	probe(ctx context.Context, scope string) error
	// describe returns the path's kind and its store's type, for the
	// start line.
	describe() (kind, store string)
}

// pathStore is a path's store: the user's value (for the start line), its
// driver, and the driver's capabilities, asked once. It gives a Path its
// driverCaps and driver.
type pathStore[D dedupdriver.Common] struct {
	store any
	drv   D
	caps  dedupdriver.Caps
}

// newPathStore returns the pathStore of store; store and its driver may be
// nil (validate reports them).
func newPathStore[D dedupdriver.Common](store interface{ Driver() D }) pathStore[D] {
	s := pathStore[D]{store: store}
	if !cfgerr.IsNil(store) {
		s.drv = store.Driver()
	}
	if !cfgerr.IsNil(s.drv) {
		s.caps = s.drv.Caps()
	}
	return s
}

// validate adds a nil store or driver of the path named path to l.
func (s *pathStore[D]) validate(l *cfgerr.List, path string) {
	switch {
	case cfgerr.IsNil(s.store):
		l.Add(path+" store", "nil")
	case cfgerr.IsNil(s.drv):
		l.Add(path+" store", "its Driver is nil")
	}
}

func (s *pathStore[D]) driverCaps() dedupdriver.Caps { return s.caps }

func (s *pathStore[D]) driver() dedupdriver.Common { return s.drv }

// pathEnv is what a Path gets from its Runner, as values: the scope, the
// logger, the configuration it reads, the counters, the store's outage
// tracker, the observer of the hooks, and the helpers that call a handler
// and classify its failure. A path never reaches into the Runner. Built
// once in NewRunner; safe for concurrent use by the lanes.
type pathEnv struct {
	scope          string        // Config.Name: the scope of every key
	log            *slog.Logger  // with the consumer's name
	retry          RetryPolicy   // Config.Retry, with defaults
	handlerTimeout time.Duration // Config.HandlerTimeout; 0: none
	maxResultBytes int           // Config.MaxResultBytes; negative: no limit
	stats          *counters
	storeOut       *outage // the store's run of failures (see Health)
	obs            *observer
	// takeAhead takes a lane's next batch without waiting and prepares it
	// (see Runner.takeAhead); nil when there is none to take.
	takeAhead func(ctx context.Context, l *lane) *prepared
}

// infraDelay counts a failure of the store and returns the retry delay,
// growing with the run of such failures (which are not attempts) up to
// outageProbe, so that the messages sent back come again soon after the
// store answers.
func (env *pathEnv) infraDelay() time.Duration {
	return min(env.retry.Backoff(env.storeOut.fail()), outageProbe)
}

func (env *pathEnv) infraOK() { env.storeOut.succeed() }

// msgCtx returns ctx seen through the message context of j when a
// HookReceived may have given it values (a span, so that a trace-aware log
// handler ties a line to the message, and the handler's spans join it).
// Without such hooks it is ctx itself.
func (env *pathEnv) msgCtx(ctx context.Context, j *job) context.Context {
	if len(env.obs.received) == 0 || j.ctx == nil {
		return ctx
	}
	return overlay{Context: ctx, vals: j.ctx}
}

// call runs a handler with the key in its context, the handler timeout, and
// panic recovery.
func (env *pathEnv) call(ctx context.Context, j *job, fn func(ctx context.Context) error) (err error) {
	ctx = withKeys(env.msgCtx(ctx, j), &j.msg.keys)
	j.msg.setReturned(nil, false) // a run again starts with no result
	if len(env.obs.handlerStart) > 0 || len(env.obs.handlerEnd) > 0 {
		for _, h := range env.obs.handlerStart {
			ctx = h.OnHandlerStart(ctx, j.msg)
		}
		start := time.Now()
		defer func() {
			d := time.Since(start)
			for _, h := range env.obs.handlerEnd {
				h.OnHandlerEnd(ctx, j.msg, d, err)
			}
		}()
	}
	return env.guard(ctx, fn)
}

// guard runs a handler's call fn with the handler timeout, and turns its
// panic into a *PanicError.
func (env *pathEnv) guard(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	if env.handlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, env.handlerTimeout)
		defer cancel()
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
func (env *pathEnv) backoff(j *job) time.Duration {
	if j.delay > 0 {
		return j.delay
	}
	var ra *retryAfterError
	if errors.As(j.err, &ra) {
		return ra.delay
	}
	return env.retry.Backoff(j.attempt())
}

// failure classifies a handler error into an outcome.
func (env *pathEnv) failure(j *job, err error) {
	if IsPermanent(err) {
		j.set(outDeadLetter, err)
		return
	}
	j.set(outRetry, err)
	j.delay = env.backoff(j)
}

// lane is what one lane carries from one batch to the next: the batch it
// took ahead while committing the last one, the open transaction that
// commit chained and that already claimed that batch's keys, and the order
// of its partition keys.
type lane struct {
	in    <-chan *job
	cur   *prepared // the batch being handled
	ahead *prepared
	chain chained
	order order
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

// sleep waits for d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
