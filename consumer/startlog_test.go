package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// Run logs one INFO line at start saying what the worker consumes, with
// which store and which key function.
func TestRunLogsWhatItConsumes(t *testing.T) {
	store := memStore(t)
	b := memBroker(t, memsource.Config{})
	var logs runtest.SyncBuffer
	r := newRunner(t, b.Source("orders"),
		consumer.Transactional(store, func(context.Context, *memdedup.Tx, *consumer.Message) error { return nil }),
		consumer.Config{Name: "billing", KeyFunc: consumer.RequireKey, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	stop := runtest.Start(t, r)
	b.Publish("orders", memsource.Outgoing{Key: "k"})
	runtest.WaitFor(t, runtest.Timeout, runtest.Say("the message handled"), func() bool { return r.Stats().Handled >= 1 })
	stop()
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=INFO") && strings.Contains(l, "consuming") {
			line = l
		}
	}
	for _, want := range []string{"consumer=billing", `source="memsource topic=orders"`, "memdedup", "consumer.RequireKey", "path=transactional"} {
		if !strings.Contains(line, want) {
			t.Errorf("start line %q lacks %q; logs:\n%s", line, want, logs.String())
		}
	}
	if n := strings.Count(line, "consumer="); n != 1 {
		t.Errorf("start line %q names the consumer %d times, want once", line, n)
	}
	// The shutdown: one line as the drain starts, one when it ended.
	var draining, drained bool
	for _, l := range strings.Split(logs.String(), "\n") {
		draining = draining || strings.Contains(l, "level=INFO") && strings.Contains(l, "msg=\"stopping: draining") && strings.Contains(l, "drain_timeout=30s")
		drained = drained || strings.Contains(l, "level=INFO") && strings.Contains(l, "msg=stopped") && strings.Contains(l, "consumer=billing")
	}
	if !draining || !drained {
		t.Errorf("drain logged start %v, end %v; want both; logs:\n%s", draining, drained, logs.String())
	}
}
