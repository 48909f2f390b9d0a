package kafkasource

import (
	"context"
	"errors"
	"testing"

	"github.com/segmentio/kafka-go"
)

// A wait that the context ended reports the context's error, and the last
// error of the wait only when there was one.
func TestWaitEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := waitEnded(ctx, nil); err.Error() != context.Canceled.Error() {
		t.Errorf("waitEnded(nil) = %q, want %q", err, context.Canceled)
	}
	err := waitEnded(ctx, kafka.LeaderNotAvailable)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, kafka.LeaderNotAvailable) {
		t.Errorf("waitEnded(LeaderNotAvailable) = %v, want both errors wrapped", err)
	}
}
