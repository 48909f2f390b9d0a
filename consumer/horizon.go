package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/idemq/idemq"
)

// Unbounded is the redelivery horizon of a broker that keeps a message for
// as long as nobody settles it (a RabbitMQ queue without a message TTL).
const Unbounded = time.Duration(math.MaxInt64)

// HorizonReporter is implemented by sources that can tell how late a
// redelivery may come. The Runner asks once, when Run starts, and compares
// the answer with how long its store remembers a processed message
// (dedupdriver.Caps.Retention, or LeaseOptions.Retention on the lease path): a
// redelivery older than the store's retention is no longer recognised and
// runs the handler again.
//
//   - horizon ≤ retention: nothing to say.
//   - horizon > retention: Run refuses to start with a *idemq.ConfigError that
//     states both durations, unless Config.AllowShortRetention is set; then
//     it logs one WARN with both and runs.
//   - horizon Unbounded (a RabbitMQ queue the source declared without a
//     message TTL): Run logs one INFO line that names the fix (a message
//     TTL on the queue, at most the retention) and runs. The broker keeps
//     an unsettled message for ever, but it hands a processed message whose
//     acknowledgement was lost back at once when the consumer's channel
//     closes: it comes later than the retention only if no consumer runs
//     for that long.
//   - an error matching ErrHorizonUnknown (a queue the source did not
//     declare): Run logs one WARN that says the retention is not checked
//     and how to check it, INFO with Config.AllowShortRetention, and runs.
//   - another error: Run logs one WARN and runs unchecked.
type HorizonReporter interface {
	// RedeliveryHorizon returns the longest time after it was published
	// that the broker may still deliver a message (its retention: SQS's
	// MessageRetentionPeriod, a Kafka topic's retention.ms, a RabbitMQ
	// queue's x-message-ttl), or Unbounded.
	RedeliveryHorizon(ctx context.Context) (time.Duration, error)
}

// ErrHorizonUnknown is matched by the error of a HorizonReporter that cannot
// tell its broker's redelivery horizon, such as amqpsource for a queue it
// did not declare (AMQP does not return a queue's arguments).
var ErrHorizonUnknown = errors.New("idemq: redelivery horizon unknown")

// horizonTimeout bounds the source's RedeliveryHorizon call at the start of
// Run.
const horizonTimeout = 10 * time.Second

// checkRetention compares the redelivery horizon of src with the retention
// of the store of path (see HorizonReporter); allowShort is
// Config.AllowShortRetention.
func checkRetention(ctx context.Context, src Source, path Path, log *slog.Logger, allowShort bool) error {
	hr, ok := src.(HorizonReporter)
	if !ok {
		return nil
	}
	retention, ok := path.retention()
	if !ok {
		return nil
	}
	hctx, cancel := context.WithTimeout(ctx, horizonTimeout)
	horizon, err := hr.RedeliveryHorizon(hctx)
	cancel()
	switch {
	case errors.Is(err, ErrHorizonUnknown):
		level := slog.LevelWarn
		if allowShort {
			level = slog.LevelInfo
		}
		log.LogAttrs(ctx, level, "the source cannot tell how late the broker may redeliver a message; the dedup retention is not checked against it (set Config.AllowShortRetention to accept that)",
			slog.Duration(LogKeyRetention, retention), slog.Any(LogKeyError, err))
	case err != nil:
		log.LogAttrs(ctx, slog.LevelWarn, "could not read the source's redelivery horizon; the dedup retention is not checked against it",
			slog.Duration(LogKeyRetention, retention), slog.Any(LogKeyError, err))
	case horizon == Unbounded:
		log.LogAttrs(ctx, slog.LevelInfo, "the broker keeps unsettled messages without a time limit: a message redelivered after the dedup retention (when no consumer ran for that long) runs the handler again; a message TTL (x-message-ttl) of at most the retention bounds it",
			slog.String(LogKeyHorizon, "unbounded"), slog.Duration(LogKeyRetention, retention))
	case horizon <= retention:
	case allowShort:
		log.LogAttrs(ctx, slog.LevelWarn, "the broker may redeliver a message later than the dedup store remembers it: such a redelivery runs the handler again (Config.AllowShortRetention is set)",
			slog.Duration(LogKeyHorizon, horizon), slog.Duration(LogKeyRetention, retention))
	default:
		return &idemq.ConfigError{Field: "AllowShortRetention", Reason: fmt.Sprintf(
			"the source's broker may deliver a message again up to %s after it was sent (its redelivery horizon), but the dedup store forgets a processed message after %s, so a redelivery between the two would run the handler again: raise the store's retention to at least %s, lower the broker's retention, or set Config.AllowShortRetention to accept it",
			days(horizon), days(retention), days(horizon))}
	}
	return nil
}

// days formats d for the retention messages: "96h0m0s (4 days)".
func days(d time.Duration) string {
	if d < 24*time.Hour {
		return d.String()
	}
	return fmt.Sprintf("%s (%.4g days)", d, d.Hours()/24)
}
