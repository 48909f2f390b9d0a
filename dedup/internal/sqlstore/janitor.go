package sqlstore

import (
	"context"
	"log/slog"
	"time"
)

// Cleanup calls batch until it reports that another process is cleaning
// (busy), fails, or deletes fewer than size records, and returns how many
// records the calls deleted.
func Cleanup(ctx context.Context, size int, batch func(ctx context.Context) (deleted int64, busy bool, err error)) (int64, error) {
	return CleanupPaced(ctx, size, 0, batch)
}

// CleanupPaced is Cleanup with a pause between two batches, so that a
// backlog is deleted at most size records per pause (fewer, by the batches'
// own time) and the cleaner leaves the database to the claims in between. A
// pause of 0 or less means none. When ctx is done during a pause, it returns
// the records deleted so far and ctx's error.
func CleanupPaced(ctx context.Context, size int, pause time.Duration, batch func(ctx context.Context) (deleted int64, busy bool, err error)) (int64, error) {
	var total int64
	for {
		n, busy, err := batch(ctx)
		total += n
		if err != nil || busy || n < int64(size) {
			return total, err
		}
		if pause > 0 {
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return total, ctx.Err()
			case <-t.C:
			}
		}
	}
}

// Janitor is what RunJanitor does on every tick.
type Janitor struct {
	// Interval is the time between two cleanups.
	Interval time.Duration
	// Log receives failures and deletions, prefixed with Store.
	Log   *slog.Logger
	Store string
	// Cleanup deletes expired records and returns how many.
	Cleanup func(ctx context.Context) (int64, error)
	// Measure, if set, measures the table after a cleanup, at most once per
	// MeasureEvery (every cleanup when zero, never when negative).
	Measure      func(ctx context.Context) error
	MeasureEvery time.Duration
}

// RunJanitor calls j.Cleanup every j.Interval until ctx is done, then
// j.Measure when due, logging failures and deletions with the store's name
// and ctx, and returns nil when ctx is done.
func RunJanitor(ctx context.Context, j Janitor) error {
	t := time.NewTicker(j.Interval)
	defer t.Stop()
	var measured time.Time
	for {
		n, err := j.Cleanup(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			j.Log.WarnContext(ctx, j.Store+": cleanup failed", "err", err)
		case n > 0:
			j.Log.DebugContext(ctx, j.Store+": expired records deleted", "count", n)
		}
		if j.Measure != nil && j.MeasureEvery >= 0 && (measured.IsZero() || time.Since(measured) >= j.MeasureEvery) {
			measured = time.Now()
			if err := j.Measure(ctx); err != nil && ctx.Err() == nil {
				j.Log.WarnContext(ctx, j.Store+": measuring the table failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
