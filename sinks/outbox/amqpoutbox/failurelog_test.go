package amqpoutbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
)

// A relay publishing to a queue that does not exist (the default exchange
// returns the messages: NO_ROUTE) says so at the first failure, with the
// row, the destination and the broker's error under the runner's key
// "err", and not once per failure: 5 rows failing 3 times each within
// FailureReminder give one WARN line and one ERROR line for their parks,
// logged with the relay's ctx.
func TestRelayAMQPNoRouteLogged(t *testing.T) {
	url := testenv.AMQPURL(t)
	pool, _, _ := relaytest.NewPool(t)
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	missing := "outbox-missing-" + hex.EncodeToString(b) // never declared
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("nr-%d", i), Destination: "", RoutingKey: missing, Key: fmt.Sprintf("k-%d", i), Body: []byte("x")})
	}
	relaytest.Insert(t, pool, msgs)

	var logs relaytest.LogCapture
	cfg := relaytest.FastConfig()
	cfg.MaxAttempts, cfg.FailureReminder, cfg.Logger = 3, time.Hour, logs.Logger()
	r, err := outbox.NewRelay(pool, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testenv.MarkedContext(context.Background(), "relay"))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Parked == int64(len(msgs))
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	warn := logs.Lines("outbox relay: publish failed; the row will be retried")
	if len(warn) != 1 {
		t.Fatalf("%d WARN lines about the %d failures, want 1 (the first; the rest within FailureReminder): %+v", len(warn), 2*len(msgs), warn)
	}
	parked := logs.Lines("outbox relay: row parked")
	if len(parked) != 1 {
		t.Fatalf("%d lines about the %d parks, want 1: %+v", len(parked), len(msgs), parked)
	}
	for _, l := range []relaytest.LogLine{warn[0], parked[0]} {
		want := map[string]string{"destination": "/" + missing}
		for k, v := range want {
			if l.Attrs[k] != v {
				t.Errorf("%q: %s=%q, want %q", l.Message, k, l.Attrs[k], v)
			}
		}
		if !strings.HasPrefix(l.Attrs["message_id"], "nr-") || l.Attrs["attempt"] == "" {
			t.Errorf("%q names no row: %v", l.Message, l.Attrs)
		}
		if !strings.Contains(l.Attrs["err"], "NO_ROUTE") {
			t.Errorf("%q: err=%q, want the broker's NO_ROUTE", l.Message, l.Attrs["err"])
		}
		if l.Mark != "relay" {
			t.Errorf("%q was not logged with the relay's ctx", l.Message)
		}
	}
	if warn[0].Level != slog.LevelWarn || parked[0].Level != slog.LevelError {
		t.Errorf("levels %v and %v, want WARN and ERROR", warn[0].Level, parked[0].Level)
	}
	for _, l := range logs.Lines("") {
		if _, ok := l.Attrs["error"]; ok {
			t.Errorf("%q logs its error as error=, not err=", l.Message)
		}
	}
}
