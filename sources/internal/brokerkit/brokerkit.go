// Package brokerkit holds the machinery that the broker adapters
// (kafkasource, amqpsource, sqssource) and their dead-letter stores share:
// finding a message's own delivery, pausing between attempts at a broker
// that is away or waiting for it to show a change, keeping the warnings of
// a long outage few, and writing and reading a dead letter's metadata.
package brokerkit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/internal/metatext"
)

// Handle returns the consumer.Delivery.Handle of m when it is an H for which
// own holds: a message that the calling source received. Otherwise it
// returns an error wrapping foreign, the source's ErrForeignMessage.
func Handle[H any](m *consumer.Message, foreign error, own func(H) bool) (H, error) {
	var zero H
	if m == nil {
		return zero, fmt.Errorf("%w: nil message", foreign)
	}
	h, ok := consumer.DeliveryOf(m).Handle.(H)
	if !ok || !own(h) {
		return zero, fmt.Errorf("%w: message %q", foreign, m.ID)
	}
	return h, nil
}

// Sleep waits d or until done is closed; it reports whether d elapsed.
func Sleep(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
		return true
	}
}

// Poll calls check every interval until it reports true, or until ctx is
// done: it then returns ctx's error, with check's last error when there was
// one (the broker may have answered without showing what the wait was for).
func Poll(ctx context.Context, interval time.Duration, check func() (bool, error)) error {
	for {
		ok, err := check()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// Warnings limits the warnings of a failure that repeats, for example a
// broker that cannot be reached: the first few failures in a row are each
// logged, then one a Reminder (the runner reports the outage, and the
// attempts come often). The zero value is ready to use; it
// is not safe for concurrent use.
type Warnings struct {
	last time.Time
}

// warnEach is how many failures in a row are each logged before the lines
// are limited to one a Reminder.
const warnEach = 3

// Reminder is the least time between two limited warnings of one failure:
// the runner's default consumer.Config.OutageReminder.
var Reminder = consumer.Config{}.WithDefaults().OutageReminder

// Due reports whether the failures-th failure in a row is to be logged,
// and if so notes that it is.
func (w *Warnings) Due(failures int) bool {
	if failures > warnEach && time.Since(w.last) < Reminder {
		return false
	}
	w.last = time.Now()
	return true
}

// Recorded returns the attempts and key that a dead letter of a message
// delivered as attempt with key records for reason: those of the
// *consumer.DeadLetterError in reason (its key only when it has one), else
// attempt and key.
func Recorded(reason error, attempt int, key string) (int, string) {
	var dl *consumer.DeadLetterError
	if errors.As(reason, &dl) {
		return dl.Attempts, cmp.Or(dl.Key, key)
	}
	return attempt, key
}

// ReasonText returns the text a dead letter records for reason: its error
// text made fit for broker metadata and cut to maxBytes (metatext.Clean),
// or "unknown" for a nil reason.
func ReasonText(reason error, maxBytes int) string {
	if reason == nil {
		return "unknown"
	}
	return metatext.Clean(reason.Error(), maxBytes)
}

// Letter returns the dlq.Letter of the dead letter id with body, its
// Reason, Key, Attempts and DeadLetteredAt read with meta from the
// metadata every source writes (consumer.MetaReason, consumer.MetaKey,
// consumer.MetaAttempts, consumer.MetaDeadLetteredAt), and an empty Headers
// map for the store to fill.
func Letter(id string, body []byte, meta func(name string) string) *dlq.Letter {
	l := &dlq.Letter{ID: id, Reason: meta(consumer.MetaReason), Key: meta(consumer.MetaKey), Headers: map[string]string{}}
	l.Attempts, _ = strconv.Atoi(meta(consumer.MetaAttempts))
	l.DeadLetteredAt, _ = time.Parse(time.RFC3339Nano, meta(consumer.MetaDeadLetteredAt))
	l.Body, l.Size = dlq.Preview(body)
	return l
}
