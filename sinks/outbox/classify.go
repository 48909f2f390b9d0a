package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
)

// IsConnectionError reports whether err looks like a failure to reach a
// broker (a network error, a refused or reset connection, an unexpected
// EOF, a deadline), which Publishers report as ErrUnavailable.
func IsConnectionError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.ErrClosedPipe) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, net.ErrClosed)
}

// Unavailable wraps err with ErrUnavailable (nil stays nil).
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// NoDestination wraps err with ErrNoDestination (nil stays nil).
func NoDestination(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNoDestination, err)
}

// PublishByDestination calls publish once per destination of msgs,
// concurrently, with that destination's messages in msgs' order. Each call
// reports as Publisher.Publish does: nil, a *BatchError of its messages, or
// an error for all of them. Once every call returned, it returns the
// outcomes of msgs as BatchResult does.
func PublishByDestination(msgs []Message, publish func(group []Message) error) error {
	groups := map[string][]int{}
	for i, m := range msgs {
		groups[m.Destination] = append(groups[m.Destination], i)
	}
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for _, idx := range groups {
		wg.Go(func() {
			group := make([]Message, len(idx))
			for j, i := range idx {
				group[j] = msgs[i]
			}
			err := publish(group)
			for j, i := range idx {
				errs[i] = errAt(err, j)
			}
		})
	}
	wg.Wait()
	return BatchResult(errs)
}
