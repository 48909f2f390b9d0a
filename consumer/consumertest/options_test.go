package consumertest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/consumertest"
	"github.com/idemq/idemq/dedup/memdedup"
)

func newMemstore(t *testing.T) *memdedup.Store {
	t.Helper()
	s, err := memdedup.New(memdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A production KeyFunc runs in the replay: the key comes from a header, and
// the report counts effects per that key.
func TestReplayUsesKeyFunc(t *testing.T) {
	byOrder := func(m *consumer.Message) (string, error) {
		if k := m.Headers["order-id"]; k != "" {
			return k, nil
		}
		return "", consumer.ErrMissingKey
	}
	script := []consumertest.Delivery{
		{Key: "m1", Headers: map[string]string{"order-id": "order-1"}, Fault: consumertest.Redelivered},
		{Key: "m2", Headers: map[string]string{"order-id": "order-2"}, Fault: consumertest.CrashAfterCommit},
	}
	rep := consumertest.ReplayTx(t, newMemstore(t), func(context.Context, *memdedup.Tx, *consumer.Message) error {
		return nil
	}, script, consumertest.Options{Workers: 1, KeyFunc: byOrder})
	rep.RequireExactlyOnce(t)
	if rep.Committed["order-1"] != 1 || rep.Committed["order-2"] != 1 {
		t.Fatalf("effects per key %v, want order-1 and order-2 once each", rep.Committed)
	}
}

// Options.Retry reaches the runners: with MaxAttempts 2 a handler that
// always fails is dead-lettered after two calls.
func TestReplayUsesRetryPolicy(t *testing.T) {
	rep := consumertest.ReplayTx(t, newMemstore(t), func(context.Context, *memdedup.Tx, *consumer.Message) error {
		return errors.New("refused")
	}, []consumertest.Delivery{{Key: "k"}}, consumertest.Options{Workers: 1, Retry: consumer.RetryPolicy{MaxAttempts: 2}})
	if rep.Calls["k"] != 2 || len(rep.DeadLetters) != 1 {
		t.Fatalf("%d calls, %d dead letters; want 2 calls and the dead letter", rep.Calls["k"], len(rep.DeadLetters))
	}
}

// A replay that does not settle names the handler it waits for and says
// what may block it.
func TestReplayNamesABlockedHandler(t *testing.T) {
	rt := &recordingTB{T: t}
	consumertest.ReplayTx(rt, newMemstore(t), func(ctx context.Context, _ *memdedup.Tx, _ *consumer.Message) error {
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
		return nil
	}, []consumertest.Delivery{{Key: "stuck"}}, consumertest.Options{Workers: 1, Timeout: 300 * time.Millisecond})
	for _, want := range []string{`the handler for key "stuck" has been running for`, "Options.HandlerTimeout"} {
		if !strings.Contains(rt.failed, want) {
			t.Errorf("failure %q lacks %q", rt.failed, want)
		}
	}
}
