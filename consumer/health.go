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
)

// outage follows the consecutive failures of one dependency and makes an
// outage visible: once Config.OutageThreshold calls in a row failed, one
// ERROR line names the dependency and the error, reminders follow at most
// every Config.OutageReminder while it lasts, and one INFO line reports the
// recovery. It is safe for concurrent use.
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
	return o.streak
}

// succeed ends a run of failures.
func (o *outage) succeed() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.streak == 0 {
		return
	}
	if o.reported {
		o.recovered, o.lasted, o.failures = true, time.Since(o.since), o.streak
	}
	o.streak, o.reported = 0, false
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

// streakLen returns the current number of consecutive failures.
func (o *outage) streakLen() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.streak
}

// Health is a snapshot of a Runner's view of its dependencies, for
// readiness probes and dashboards. See Runner.Health.
type Health struct {
	// Running reports that Run is running.
	Running bool
	// Draining reports that Run's context is cancelled and the runner is
	// finishing the messages it received; it receives nothing more.
	Draining bool
	// LastReceive is when Source.Receive last returned without error
	// (zero before the first time).
	LastReceive time.Time
	// ReceiveFailures is the number of consecutive failed Receive calls.
	ReceiveFailures int
	// StoreFailures is the number of consecutive failures of the store:
	// begin, claim and commit on the transactional path; claim, refresh
	// and complete on the lease path.
	StoreFailures int
	// AckFailures is the number of consecutive failed Source.Ack calls.
	AckFailures int
	// Ready is the verdict for a readiness probe: running, not draining,
	// and no dependency has failed Config.OutageThreshold times in a row.
	Ready bool
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
	}
	if ns := r.lastReceive.Load(); ns != 0 {
		h.LastReceive = time.Unix(0, ns)
	}
	t := r.cfg.OutageThreshold
	h.Ready = h.Running && !h.Draining && h.ReceiveFailures < t && h.StoreFailures < t && h.AckFailures < t
	return h
}
