package outbox

import (
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"slices"
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
	return &wrapped{kind: ErrUnavailable, err: err}
}

// NoDestination wraps err with ErrNoDestination (nil stays nil).
func NoDestination(err error) error {
	if err == nil {
		return nil
	}
	return &wrapped{kind: ErrNoDestination, err: err}
}

// wrapped is err marked with a sentinel kind, matched by errors.Is.
type wrapped struct {
	kind, err error
}

func (w *wrapped) Error() string { return w.kind.Error() + ": " + w.err.Error() }

func (w *wrapped) Unwrap() []error { return []error{w.kind, w.err} }

// SortedHeaders returns the names of m's headers in order, so that
// publishers send headers in a stable order.
func (m Message) SortedHeaders() []string {
	return slices.Sorted(maps.Keys(m.Headers))
}

// PublishByDestination calls publish for each destination of msgs
// (ByDestination), concurrently, with the indexes of its messages in msgs;
// publish sets errs[i] to the outcome of msgs[i]. Once every call
// returned, it returns BatchResult(errs).
func PublishByDestination(msgs []Message, publish func(idx []int, errs []error)) error {
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for _, idx := range ByDestination(msgs) {
		wg.Go(func() { publish(idx, errs) })
	}
	wg.Wait()
	return BatchResult(errs)
}

// ByDestination returns the indexes of msgs grouped by destination, in
// order of first appearance; each group keeps msgs' order.
func ByDestination(msgs []Message) [][]int {
	at := map[string]int{}
	var groups [][]int
	for i, m := range msgs {
		g, ok := at[m.Destination]
		if !ok {
			g = len(groups)
			at[m.Destination] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}
