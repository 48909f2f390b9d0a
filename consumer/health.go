package consumer

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Dependency names, as logged under LogKeyDependency by the outage lines.
const (
	// DependencyBroker is the broker's receive side (Source.Receive).
	DependencyBroker = "broker"
	// DependencyBrokerAck is the broker's acknowledgements (Source.Ack).
	DependencyBrokerAck = "broker ack"
	// DependencyBrokerSettle is the broker's routes for failed messages:
	// Source.Retry, Releaser.Release and Source.DeadLetter.
	DependencyBrokerSettle = "broker settle"
	// DependencyStore is the deduplication store: the database of the
	// transactional path (begin, claim, commit), the lease store (Redis) of
	// the lease path (claim, refresh, complete).
	DependencyStore = "store"
)

// Log attribute keys of the outage lines.
const (
	LogKeyDependency = "dependency"
	LogKeyFailures   = "consecutive_failures"
	LogKeyOutage     = "outage"
	// LogKeySuppressed counts the WARN lines about single failures of a
	// dependency that were left out while its outage was reported.
	LogKeySuppressed = "suppressed"
)

// outageProbe is the longest pause between two attempts to reach a failing
// dependency: the delay after a failed Receive, the retry delay of messages
// sent back for a store failure, and the interval of the store probe while
// receiving is paused are capped at it, so that the runner goes on within
// about outageProbe of the dependency answering again, however long the
// outage lasted (RetryPolicy's backoff counts handler failures; it would
// grow past a minute in a long outage).
const outageProbe = 500 * time.Millisecond

// probeTimeout bounds one probe of the store (a stalled connection).
const probeTimeout = 5 * time.Second

// outage follows the consecutive failures of one dependency and logs its
// outage as Config.OutageThreshold and Config.OutageReminder say. It is
// safe for concurrent use.
type outage struct {
	dep       string
	threshold int
	reminder  time.Duration

	mu        sync.Mutex
	streak    int
	since     time.Time // first failure of the streak
	reported  bool      // an ERROR line was logged for this streak
	loggedAt  time.Time
	recovered bool // a reported outage ended; its INFO line is due
	lasted    time.Duration
	failures  int // of the outage that ended

	warnedAt   time.Time // the last WARN line about a single failure
	suppressed int       // WARN lines left out since
	// answered: a probe reached the dependency since its last failure (see
	// Runner.awaitStore); only a real call ends the outage.
	answered bool
	// paused: the pause of receiving was logged for this run of failures
	// (see Runner.awaitStore).
	paused bool
}

func newOutage(dep string, cfg Config) *outage {
	return &outage{dep: dep, threshold: cfg.OutageThreshold, reminder: cfg.OutageReminder}
}

// fail counts one failure and returns the length of the run of failures.
func (o *outage) fail() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.streak == 0 {
		o.since = time.Now()
	}
	o.streak++
	o.answered = false
	return o.streak
}

func (o *outage) succeed() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.streak == 0 {
		return
	}
	if o.reported {
		o.recovered, o.lasted, o.failures = true, time.Since(o.since), o.streak
	}
	o.streak, o.reported, o.suppressed, o.paused = 0, false, 0, false
}

// pause reports whether the pause of receiving for this run of failures
// is yet to be logged, and marks it logged.
func (o *outage) pause() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	first := !o.paused
	o.paused = true
	return first
}

// failed counts a failure and logs what is due.
func (o *outage) failed(ctx context.Context, log *slog.Logger, err error) int {
	n := o.fail()
	o.report(ctx, log, err)
	return n
}

// ok ends a run of failures and logs the recovery if the outage was reported.
func (o *outage) ok(ctx context.Context, log *slog.Logger) {
	o.succeed()
	o.report(ctx, log, nil)
}

// report logs the lines that are due: the recovery of a reported outage, and,
// with the error of a failure (err != nil), the outage line or a reminder.
func (o *outage) report(ctx context.Context, log *slog.Logger, err error) {
	o.mu.Lock()
	recovered, lasted, failures := o.recovered, o.lasted, o.failures
	o.recovered = false
	var msg string
	streak, since := o.streak, o.since
	if err != nil && o.streak >= o.threshold {
		switch now := time.Now(); {
		case !o.reported:
			msg = "dependency failing"
			o.reported, o.loggedAt = true, now
		case now.Sub(o.loggedAt) >= o.reminder:
			msg = "dependency still failing"
			o.loggedAt = now
		}
	}
	o.mu.Unlock()
	if recovered {
		log.LogAttrs(ctx, slog.LevelInfo, "dependency recovered", slog.String(LogKeyDependency, o.dep),
			slog.Int(LogKeyFailures, failures), slog.Duration(LogKeyOutage, lasted.Round(time.Millisecond)))
	}
	if msg != "" {
		log.LogAttrs(ctx, slog.LevelError, msg, slog.String(LogKeyDependency, o.dep), slog.Int(LogKeyFailures, streak),
			slog.Duration(LogKeyOutage, time.Since(since).Round(time.Millisecond)), slog.Any(LogKeyError, err))
	}
}

// line logs a line at level about a single failure of the dependency (one
// failed transaction, one failed Receive): every one until the outage is
// reported, then at most one per Config.OutageReminder while it lasts, as
// the outage's ERROR line and its reminders speak for the others. The next
// line logged counts those left out under LogKeySuppressed. Count the
// failure (fail, failed) before calling it.
func (o *outage) line(ctx context.Context, log *slog.Logger, level slog.Level, msg string, attrs ...slog.Attr) {
	o.mu.Lock()
	now := time.Now()
	if o.reported && now.Sub(o.warnedAt) < o.reminder {
		o.suppressed++
		o.mu.Unlock()
		return
	}
	o.warnedAt = now
	n := o.suppressed
	o.suppressed = 0
	o.mu.Unlock()
	if n > 0 {
		attrs = append(attrs, slog.Int(LogKeySuppressed, n))
	}
	log.LogAttrs(ctx, level, msg, attrs...)
}

// down reports whether the dependency's outage is declared (threshold
// failures in a row) and no probe reached it since the last failure.
func (o *outage) down() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.streak >= o.threshold && !o.answered
}

// probed records that a probe reached the dependency: the caller may try it
// again. The outage lasts until a real call succeeds (succeed), since a
// probe does not do what the calls do (a store may begin a transaction and
// still refuse to write).
func (o *outage) probed() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.answered = true
}

func (o *outage) streakLen() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.streak
}

// Health is a snapshot of a Runner's view of its dependencies, for
// readiness probes and dashboards. See Runner.Health.
type Health struct {
	// Running reports that Run is running.
	Running bool `json:"running"`
	// Draining reports that Run's context is cancelled and the runner is
	// finishing the messages it received; it receives nothing more.
	Draining bool `json:"draining"`
	// LastReceive is when Source.Receive last returned without error
	// (zero before the first time).
	LastReceive time.Time `json:"last_receive"`
	// ReceiveFailures is the number of consecutive failed Receive calls.
	ReceiveFailures int `json:"receive_failures"`
	// StoreFailures is the number of consecutive failures of the store:
	// begin, claim and commit on the transactional path; claim, refresh
	// and complete on the lease path.
	StoreFailures int `json:"store_failures"`
	// AckFailures is the number of consecutive failed Source.Ack calls.
	AckFailures int `json:"ack_failures"`
	// SettleFailures is the number of consecutive failed Source.Retry,
	// Releaser.Release and Source.DeadLetter calls. Ready ignores it: only
	// a later failed message can try the route again and end the run.
	SettleFailures int `json:"settle_failures"`
	// StoreLoss, when not empty, says how the store's server can lose the
	// records it acknowledged (Redis without an fsync'ed append-only file),
	// as the store read its settings when Run started (see
	// dedupdriver.Caps.Durability): a processed key it loses runs the handler
	// again when its message is delivered again. Ready ignores it.
	StoreLoss string `json:"store_loss,omitempty"`
	// Ready is the verdict for a readiness probe: running, not draining,
	// and neither the broker's receive side, nor the store, nor the
	// acknowledgements have failed Config.OutageThreshold times in a row.
	Ready bool `json:"ready"`
}
