package amqpsource_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/amqpsource"
)

// TestReconnectLogsCarryNewsContext checks that the reconnect lines are
// logged with the values of the context New was given, so that a
// trace-aware or service-tagging handler sees them.
func TestReconnectLogsCarryNewsContext(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	publish(t, url, q, outgoing("logctx", 1)...)
	logs := testenv.NewLogRecorder()

	ctx, cancel := context.WithTimeout(testenv.MarkedContext(context.Background(), "new"), testTimeout)
	src, err := amqpsource.New(ctx, amqpsource.Config{URL: url, Queue: q, ReconnectDelay: 20 * time.Millisecond, Logger: logs.Logger()})
	cancel() // New's deadline must not end the source's background work
	if err != nil {
		t.Fatalf("amqpsource.New: %v", err)
	}
	t.Cleanup(func() { _ = src.Close() })
	receive(t, src, 1, testTimeout)
	if n := forceCloseConnections(t, q); n != 1 {
		t.Fatalf("closed %d connections, want 1", n)
	}
	receive(t, src, 1, testTimeout) // the redelivery, on the new connection
	for _, prefix := range []string{"connection lost", "reconnected"} {
		lines := logs.Find(prefix)
		if len(lines) == 0 {
			t.Fatalf("no %q line logged", prefix)
		}
		for _, l := range lines {
			if l.Mark != "new" {
				t.Errorf("%q logged without the values of New's context", l.Message)
			}
		}
	}
}
