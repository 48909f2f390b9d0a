package consumer

import (
	"context"
	"time"
)

// AckInfo describes one Source.Ack call of the runner: the messages it
// acknowledged (one call may cover several, coalesced off the workers'
// path), when it started and ended, and its error. Messages is the
// runner's slice: read it during the call only.
type AckInfo struct {
	Messages   []*Message
	Start, End time.Time
	Err        error
}

// HookAckDone is told about every Source.Ack call, with its messages and
// timing (HookAck is told only the count). It is called from the runner's
// acknowledging goroutine; an implementation must be safe for concurrent
// use and return quickly.
type HookAckDone interface {
	OnAckDone(ctx context.Context, a AckInfo)
}
