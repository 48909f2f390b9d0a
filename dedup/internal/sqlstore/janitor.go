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
	var total int64
	for {
		n, busy, err := batch(ctx)
		total += n
		if err != nil || busy || n < int64(size) {
			return total, err
		}
	}
}

// RunJanitor calls cleanup every interval until ctx is done, logging failures
// and deletions with the store's name and ctx, and returns nil when ctx is
// done.
func RunJanitor(ctx context.Context, interval time.Duration, log *slog.Logger, store string, cleanup func(ctx context.Context) (int64, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := cleanup(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			log.WarnContext(ctx, store+": cleanup failed", "err", err)
		case n > 0:
			log.DebugContext(ctx, store+": expired records deleted", "count", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
