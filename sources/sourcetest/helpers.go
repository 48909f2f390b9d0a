package sourcetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
)

// Bounds of the suite's waits.
const (
	// receiveBatch is the max passed to Receive.
	receiveBatch = 10
	// promptly bounds calls that must return at once (a Receive with a
	// cancelled context, a Receive interrupted by Close).
	promptly = 5 * time.Second
	// defaultDeliveryTimeout is used when Features.DeliveryTimeout is zero,
	// and bounds an Ack.
	defaultDeliveryTimeout = 30 * time.Second
)

// open opens a source on topic and closes it when the test ends.
func (s *suite) open(t *testing.T, topic string) consumer.Source {
	t.Helper()
	src := s.h.NewSource(t, topic)
	if src == nil {
		t.Fatalf("sourcetest: Harness.NewSource(%q) returned nil", topic)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// outgoing returns n messages with keys prefix-0000, prefix-0001, ... and a
// JSON body naming the key.
func outgoing(prefix string, n int) []Outgoing {
	out := make([]Outgoing, n)
	for i := range out {
		key := fmt.Sprintf("%s-%04d", prefix, i)
		out[i] = Outgoing{
			Key:     key,
			Body:    fmt.Appendf(nil, `{"key":%q,"n":%d}`, key, i),
			Headers: map[string]string{"x-sourcetest": prefix},
		}
	}
	return out
}

// keysOf returns the keys of msgs, in order.
func keysOf(msgs []Outgoing) []string {
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		keys[i] = m.Key
	}
	return keys
}

// byKey indexes msgs by key.
func byKey(msgs []Outgoing) map[string]Outgoing {
	m := make(map[string]Outgoing, len(msgs))
	for _, o := range msgs {
		m[o.Key] = o
	}
	return m
}

// receive calls src.Receive(ctx, max) and fails t if it does not return
// within promptly after ctx is done: a Receive that ignores its context would
// otherwise hang the suite.
func receive(t *testing.T, ctx context.Context, src consumer.Source, max int) ([]*consumer.Message, error) {
	t.Helper()
	type result struct {
		msgs []*consumer.Message
		err  error
	}
	done := make(chan result, 1)
	go func() {
		msgs, err := src.Receive(ctx, max)
		done <- result{msgs, err}
	}()
	select {
	case r := <-done:
		return r.msgs, r.err
	case <-ctx.Done():
	}
	select {
	case r := <-done:
		return r.msgs, r.err
	case <-time.After(promptly):
		t.Fatalf("sourcetest: Receive did not return within %s after its context was done (%v)", promptly, ctx.Err())
		return nil, nil
	}
}

// receiveUntil receives from src, passing every message to each, until done
// reports true or timeout passes; then it fails t with what(). It returns the
// messages received, in order.
func receiveUntil(t *testing.T, src consumer.Source, timeout time.Duration, each func(*consumer.Message), done func() bool, what func() string) []*consumer.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []*consumer.Message
	for !done() {
		msgs, err := receive(t, ctx, src, receiveBatch)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("sourcetest: not done after %s: %s", timeout, what())
			}
			t.Fatalf("sourcetest: Receive: %v (while waiting: %s)", err, what())
		}
		if len(msgs) == 0 {
			t.Fatalf("sourcetest: Receive returned no messages and no error (it must block until one is available)")
		}
		if len(msgs) > receiveBatch {
			t.Fatalf("sourcetest: Receive(ctx, %d) returned %d messages", receiveBatch, len(msgs))
		}
		for _, m := range msgs {
			if m == nil {
				t.Fatalf("sourcetest: Receive returned a nil *Message")
			}
			got = append(got, m)
			if each != nil {
				each(m)
			}
		}
	}
	return got
}

// receiveKeys receives until every key in want was seen at least once, and
// returns every message received (duplicates included).
func receiveKeys(t *testing.T, src consumer.Source, timeout time.Duration, want []string, each func(*consumer.Message)) []*consumer.Message {
	t.Helper()
	pending := make(map[string]bool, len(want))
	for _, k := range want {
		pending[k] = true
	}
	return receiveUntil(t, src, timeout,
		func(m *consumer.Message) {
			delete(pending, m.Key)
			if each != nil {
				each(m)
			}
		},
		func() bool { return len(pending) == 0 },
		func() string {
			return fmt.Sprintf("%d of %d messages never received (e.g. %v)", len(pending), len(want), sample(pending))
		},
	)
}

// expectQuiet receives from src for window and fails t if any message
// arrives.
func expectQuiet(t *testing.T, src consumer.Source, window time.Duration, why string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	for {
		msgs, err := receive(t, ctx, src, receiveBatch)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			t.Fatalf("sourcetest: Receive: %v", err)
		}
		if len(msgs) > 0 {
			t.Fatalf("sourcetest: %s, but %d message(s) arrived within %s (first: key %q id %q attempt %d)",
				why, len(msgs), window, msgs[0].Key, msgs[0].ID, msgs[0].Attempt)
		}
	}
}

// ack acknowledges msgs and fails t on error.
func ack(t *testing.T, src consumer.Source, msgs ...*consumer.Message) {
	t.Helper()
	if len(msgs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultDeliveryTimeout)
	defer cancel()
	if err := src.Ack(ctx, msgs); err != nil {
		t.Fatalf("sourcetest: Ack of %d message(s): %v", len(msgs), err)
	}
}

// checkMessage fails t unless m matches the message published as want.
func checkMessage(t *testing.T, m *consumer.Message, want Outgoing) {
	t.Helper()
	switch {
	case m.ID == "":
		t.Errorf("sourcetest: message %q has an empty ID", m.Key)
	case string(m.Body) != string(want.Body):
		t.Errorf("sourcetest: message %q has body %q, want %q", m.Key, m.Body, want.Body)
	case m.Attempt < 1:
		t.Errorf("sourcetest: message %q has Attempt %d, want at least 1", m.Key, m.Attempt)
	case m.ReceivedAt.IsZero():
		t.Errorf("sourcetest: message %q has a zero ReceivedAt", m.Key)
	}
	for k, v := range want.Headers {
		if got, ok := m.Headers[k]; !ok || got != v {
			t.Errorf("sourcetest: message %q has header %s=%q (present %v), want %q", m.Key, k, got, ok, v)
		}
	}
}

// sample returns up to 5 keys of set, sorted, for failure messages.
func sample(set map[string]bool) []string {
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) > 5 {
		keys = keys[:5]
	}
	return keys
}

// returnsPromptly runs fn and fails t if it does not return within promptly.
func returnsPromptly(t *testing.T, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(promptly):
		t.Fatalf("sourcetest: %s did not return within %s", what, promptly)
		return nil
	}
}

// isClosed reports whether err reports a closed source.
func isClosed(err error) bool { return errors.Is(err, consumer.ErrClosed) }
