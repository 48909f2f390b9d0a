package outbox

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The failures of one destination are logged at once, then at most once
// per reminder with the number left out; parks have a reminder of their
// own; flush sums up what no later line reported; other destinations are
// logged independently.
func TestFailureLog(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	l := newFailureLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})), time.Minute)
	l.now = func() time.Time { return now }
	ctx := context.Background()
	q := Message{ID: "o-1/0", Destination: "", RoutingKey: "missing", Key: "o-1"}
	lines := func() []string {
		t.Helper()
		s := strings.TrimSpace(buf.String())
		buf.Reset()
		if s == "" {
			return nil
		}
		return strings.Split(s, "\n")
	}
	want := func(step string, got []string, want ...string) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: logged %d lines, want %d:\n%s", step, len(got), len(want), strings.Join(got, "\n"))
		}
		for i := range want {
			if !strings.Contains(got[i], want[i]) {
				t.Fatalf("%s: line %d is\n%s\nwant it to contain\n%s", step, i, got[i], want[i])
			}
		}
	}

	l.failed(ctx, q, 1, "no route", false, time.Second)
	want("first failure", lines(),
		`level=WARN msg="outbox relay: publish failed; the row will be retried" destination=/missing message_id=o-1/0 attempt=1 key=o-1 delay=1s err="no route"`)
	for i := range 5 {
		now = now.Add(time.Second)
		l.failed(ctx, q, 2+i, "no route", false, time.Second)
	}
	l.failed(ctx, Message{ID: "x/0", Destination: "other"}, 1, "refused", false, time.Second)
	want("failures within the reminder", lines(),
		`level=WARN msg="outbox relay: publish failed; the row will be retried" destination=other message_id=x/0 attempt=1 delay=1s err=refused`)
	l.failed(ctx, q, 7, "no route", true, 0)
	want("first park", lines(), `level=ERROR msg="outbox relay: row parked" destination=/missing message_id=o-1/0 attempt=7 key=o-1 err="no route"`)
	l.failed(ctx, Message{ID: "o-2/0", RoutingKey: "missing"}, 7, "no route", true, 0)
	l.flush(ctx)
	want("a park and a flush within the reminder", lines())

	now = now.Add(time.Minute)
	l.failed(ctx, Message{ID: "o-3/0", RoutingKey: "missing"}, 1, "no route", false, time.Second)
	want("a failure after the reminder", lines(), `message_id=o-3/0 attempt=1 delay=1s suppressed=5 err="no route"`)
	l.flush(ctx)
	want("flush after the reminder", lines(),
		`level=ERROR msg="outbox relay: publishes failed since the last line" destination=/missing suppressed=0 parked=1 err="no route"`)
	now = now.Add(time.Minute)
	l.flush(ctx)
	want("flush with nothing left out", lines())
	if len(l.dests) != 0 {
		t.Fatalf("after a quiet reminder the log still follows %d destinations", len(l.dests))
	}
}
