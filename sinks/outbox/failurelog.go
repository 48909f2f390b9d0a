package outbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer"
)

// failureLog logs the rows whose publish failed as Config.FailureReminder
// says, per destination. Parks have a reminder of their own, so that the
// first park of a destination is never hidden by its retries; flush sums
// up the failures left out and not followed by another line once the
// reminder has passed. It is safe for concurrent use.
type failureLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	dests map[string]*destFailures
}

// destFailures is the log state of one destination.
type destFailures struct {
	retry, park reminder
	last        time.Time // the latest failure
	lastErr     string
}

// reminder is one kind of line of one destination: when it was last
// logged and how many failures were left out since.
type reminder struct {
	at         time.Time
	suppressed int
}

// due reports whether a line may be logged at now, and if so takes it:
// it returns the failures left out before it and starts a new period.
func (m *reminder) due(now time.Time, every time.Duration) (bool, int) {
	if !m.at.IsZero() && now.Sub(m.at) < every {
		m.suppressed++
		return false, 0
	}
	n := m.suppressed
	m.at, m.suppressed = now, 0
	return true, n
}

func newFailureLog(log *slog.Logger, every time.Duration) *failureLog {
	return &failureLog{log: log, every: every, now: time.Now, dests: map[string]*destFailures{}}
}

// failed reports the failed publish of m, its attempts-th, with err; park
// tells whether the row is parked, else it is tried again after retryIn.
func (l *failureLog) failed(ctx context.Context, m Message, attempts int, err string, park bool, retryIn time.Duration) {
	now := l.now()
	dest := destinationName(m)
	l.mu.Lock()
	d := l.dests[dest]
	if d == nil {
		d = &destFailures{}
		l.dests[dest] = d
	}
	d.last, d.lastErr = now, err
	r := &d.retry
	if park {
		r = &d.park
	}
	logIt, suppressed := r.due(now, l.every)
	l.mu.Unlock()
	if !logIt {
		return
	}
	attrs := []slog.Attr{
		slog.String(logKeyDestination, dest), slog.String(consumer.LogKeyID, m.ID),
		slog.Int(consumer.LogKeyAttempt, attempts),
	}
	if m.Key != "" {
		attrs = append(attrs, slog.String(consumer.LogKeyKey, m.Key))
	}
	level, msg := slog.LevelWarn, "outbox relay: publish failed; the row will be retried"
	if park {
		level, msg = slog.LevelError, "outbox relay: row parked"
	} else {
		attrs = append(attrs, slog.Duration(consumer.LogKeyDelay, retryIn))
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int(consumer.LogKeySuppressed, suppressed))
	}
	attrs = append(attrs, slog.String(consumer.LogKeyError, err))
	l.log.LogAttrs(ctx, level, msg, attrs...)
}

// flush logs, for each destination whose reminder has passed since its
// last line, the failures left out since, and forgets the destinations
// with nothing left to report.
func (l *failureLog) flush(ctx context.Context) {
	type summary struct {
		dest, err      string
		retries, parks int
	}
	var out []summary
	now := l.now()
	l.mu.Lock()
	for dest, d := range l.dests {
		s := summary{dest: dest, err: d.lastErr}
		if d.retry.suppressed > 0 && now.Sub(d.retry.at) >= l.every {
			s.retries, d.retry = d.retry.suppressed, reminder{at: now}
		}
		if d.park.suppressed > 0 && now.Sub(d.park.at) >= l.every {
			s.parks, d.park = d.park.suppressed, reminder{at: now}
		}
		if s.retries+s.parks > 0 {
			out = append(out, s)
		}
		if d.retry.suppressed == 0 && d.park.suppressed == 0 && now.Sub(d.last) >= l.every {
			delete(l.dests, dest)
		}
	}
	l.mu.Unlock()
	for _, s := range out {
		level := slog.LevelWarn
		if s.parks > 0 {
			level = slog.LevelError
		}
		l.log.LogAttrs(ctx, level, "outbox relay: publishes failed since the last line",
			slog.String(logKeyDestination, s.dest), slog.Int(consumer.LogKeySuppressed, s.retries),
			slog.Int(logKeyParked, s.parks), slog.String(consumer.LogKeyError, s.err))
	}
}

// destinationName names m's destination in logs: the destination, and
// the routing key after a "/" when m has one (a RabbitMQ queue reached
// through an exchange, "" for the default one).
func destinationName(m Message) string {
	if m.RoutingKey == "" {
		return m.Destination
	}
	return m.Destination + "/" + m.RoutingKey
}
