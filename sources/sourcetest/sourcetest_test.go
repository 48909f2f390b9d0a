package sourcetest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// brokenEnv names the defect the child process injects.
const brokenEnv = "SOURCETEST_SELFTEST_DEFECT"

// defects are ways a source can break its contract, each with the suite test
// (or subtest) that must catch it.
var defects = []struct {
	name, caughtBy, what string
}{
	{"ack-ignored", "PublishReceiveAck", "Ack returns nil without acknowledging"},
	{"cumulative-ack", "PartialAck", "Ack acknowledges every message received so far"},
	{"attempt-stuck", "Retry", "Attempt never grows"},
	{"id-unstable", "CloseRedelivers", "Message.ID changes on redelivery"},
	{"ignores-ctx", "CancelAndClose/CancelledContext", "Receive ignores its context"},
	{"closed-methods-ok", "CancelAndClose", "Ack succeeds after Close"},
	{"reorders", "OrderedByPartitionKey", "each batch is returned in reverse order"},
	{"dead-letter-redelivers", "DeadLetter", "DeadLetter puts the message back"},
	{"retry-early", "Retry", "Retry ignores its delay"},
}

// TestSuiteCatchesBrokenSources runs the suite, in child processes, against
// memsource sources with one defect each, and checks that the suite fails in
// the test meant to catch it.
func TestSuiteCatchesBrokenSources(t *testing.T) {
	if defect := os.Getenv(brokenEnv); defect != "" {
		sourcetest.Run(t, harness(t, defect))
		return
	}
	if testing.Short() {
		t.Skip("runs the suite once per defect")
	}
	for _, d := range defects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0],
				"-test.run=^TestSuiteCatchesBrokenSources$/^Parallel$/^"+d.caughtBy+"$",
				"-test.timeout=110s")
			cmd.Env = append(os.Environ(), brokenEnv+"="+d.name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a source whose %s", d.what)
			}
			want := "--- FAIL: TestSuiteCatchesBrokenSources/Parallel/" + d.caughtBy
			if !strings.Contains(string(out), want) {
				t.Fatalf("the suite did not fail %s for a source whose %s; output:\n%s", d.caughtBy, d.what, out)
			}
		})
	}
}

func harness(t *testing.T, defect string) sourcetest.Harness {
	b := memsource.New(memsource.Config{VisibilityTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = b.Close() })
	var topics atomic.Int64
	return sourcetest.Harness{
		Features: sourcetest.Features{
			CompetingConsumers:    true,
			OrderedByPartitionKey: true,
			RetryDelayHonoured:    true,
			RedeliveryTimeout:     time.Second,
			// memsource delivers at once: a message lost by a defect
			// fails its test after seconds, not after the 30 s default.
			DeliveryTimeout:    5 * time.Second,
			DeadLetterReadable: true,
		},
		NewTopic: func(t *testing.T) string { return fmt.Sprintf("topic-%d", topics.Add(1)) },
		NewSource: func(t *testing.T, topic string) consumer.Source {
			return &broken{Source: b.Source(topic), defect: defect}
		},
		Publish: func(t *testing.T, topic string, msgs ...sourcetest.Outgoing) {
			for _, m := range msgs {
				b.Publish(topic, memsource.Outgoing{Key: m.Key, Body: m.Body, Headers: m.Headers, PartitionKey: m.PartitionKey})
			}
		},
		DeadLetters: func(t *testing.T, topic string) []sourcetest.Outgoing {
			var out []sourcetest.Outgoing
			for _, d := range b.DeadLetters(topic) {
				out = append(out, sourcetest.Outgoing{Key: d.Key, Body: d.Body, Headers: map[string]string{consumer.MetaReason: d.Reason}})
			}
			return out
		},
	}
}

// broken wraps a memsource Source and injects one defect.
type broken struct {
	consumer.Source
	defect string
	closed atomic.Bool

	mu   sync.Mutex
	held []*consumer.Message
}

func (s *broken) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	if s.defect == "ignores-ctx" {
		ctx = context.Background()
	}
	msgs, err := s.Source.Receive(ctx, max)
	for _, m := range msgs {
		switch s.defect {
		case "attempt-stuck":
			m.Attempt = 1
		case "id-unstable":
			m.ID = fmt.Sprintf("%s#%d", m.ID, m.Attempt)
		}
	}
	if s.defect == "reorders" {
		slices.Reverse(msgs)
	}
	s.mu.Lock()
	s.held = append(s.held, msgs...)
	s.mu.Unlock()
	return msgs, err
}

func (s *broken) Ack(ctx context.Context, msgs []*consumer.Message) error {
	switch s.defect {
	case "ack-ignored":
		return nil
	case "closed-methods-ok":
		if s.closed.Load() {
			return nil
		}
	case "cumulative-ack":
		s.mu.Lock()
		msgs, s.held = append(s.held, msgs...), nil
		s.mu.Unlock()
	}
	return s.Source.Ack(ctx, msgs)
}

func (s *broken) Retry(ctx context.Context, msg *consumer.Message, delay time.Duration) error {
	if s.defect == "retry-early" {
		delay = 0
	}
	return s.Source.Retry(ctx, msg, delay)
}

func (s *broken) DeadLetter(ctx context.Context, msg *consumer.Message, reason error) error {
	if s.defect == "dead-letter-redelivers" {
		return s.Source.Retry(ctx, msg, 0)
	}
	return s.Source.DeadLetter(ctx, msg, reason)
}

func (s *broken) Close() error {
	s.closed.Store(true)
	return s.Source.Close()
}
