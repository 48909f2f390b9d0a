package consumer

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The outage lines: nothing below the threshold, one ERROR at it, reminders
// only after OutageReminder, one INFO on recovery, and nothing for a run of
// failures that never reached the threshold.
func TestOutageLines(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	ctx := context.Background()
	o := newOutage("store", Config{OutageThreshold: 3, OutageReminder: time.Hour})
	boom := errors.New("connection refused")
	count := func(msg string) int { return strings.Count(buf.String(), `msg="`+msg+`"`) }

	o.failed(ctx, log, boom)
	o.failed(ctx, log, boom)
	o.ok(ctx, log) // two failures: no outage
	if buf.Len() != 0 {
		t.Fatalf("logged below the threshold:\n%s", buf.String())
	}
	for range 10 {
		o.failed(ctx, log, boom)
	}
	if count("dependency failing") != 1 || count("dependency still failing") != 0 || o.streakLen() != 10 {
		t.Fatalf("after 10 failures:\n%s", buf.String())
	}
	o.reminder = 0 // every further failure is due a reminder
	o.failed(ctx, log, boom)
	if count("dependency still failing") != 1 {
		t.Fatalf("no reminder once due:\n%s", buf.String())
	}
	o.ok(ctx, log)
	o.ok(ctx, log)
	if count("dependency recovered") != 1 || o.streakLen() != 0 {
		t.Fatalf("recovery lines:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), "dependency=store") || !strings.Contains(buf.String(), "connection refused") {
		t.Fatalf("lines do not name the dependency and the error:\n%s", buf.String())
	}
}
