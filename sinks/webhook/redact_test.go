package webhook_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sinks/webhook"
	"github.com/idemq/idemq/sinks/webhook/webhooktest"
)

// plantedSecret is put in the password, the path and the query of the
// webhook URL; no output may show it.
const plantedSecret = "Pl4ntedS3cret"

// closedPort returns an address on loopback where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// secretURL puts the planted secret in the user info, path and query of base.
func secretURL(base string) string {
	return strings.Replace(base, "://", "://hook:"+plantedSecret+"@", 1) + "/hooks/" + plantedSecret + "?token=" + plantedSecret
}

// TestNoSecretInOutput runs the sink's failure paths with a secret in its
// URL — configuration errors, an unreachable endpoint, an endpoint that
// refuses the call — through a Runner until the messages are dead-lettered,
// and greps every output for the secret: returned errors, the sink's, the
// runner's and the broker's logs, and the dead-letter reasons.
func TestNoSecretInOutput(t *testing.T) {
	var outputs []string
	check := func(what, out string) {
		t.Helper()
		outputs = append(outputs, what)
		if strings.Contains(out, plantedSecret) {
			t.Errorf("%s shows the secret:\n%s", what, out)
		}
	}

	for _, raw := range []string{
		"ftp://u:" + plantedSecret + "@127.0.0.1/" + plantedSecret + "?" + plantedSecret, // wrong scheme
		"http://u:" + plantedSecret + "@127.0.0.1/%zz" + plantedSecret,                   // does not parse
		"http:///" + plantedSecret + "?t=" + plantedSecret,                               // no host
	} {
		_, err := webhook.New(webhook.Config{URL: raw})
		if !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Fatalf("New(%q) = %v, want idemq.ErrInvalidConfig", raw, err)
		}
		check("New's error", err.Error())
	}

	var logs runtest.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	refusing := webhooktest.New(t, func(webhooktest.Call) webhooktest.Response {
		return webhooktest.Response{Status: http.StatusBadRequest, Body: "rejected"}
	})
	failing := webhooktest.New(t, func(webhooktest.Call) webhooktest.Response {
		return webhooktest.Response{Status: http.StatusServiceUnavailable}
	})
	for _, tc := range []struct{ name, url string }{
		{"unreachable", secretURL("http://" + closedPort(t))},
		{"refused", secretURL(refusing.URL())},
		{"failing", secretURL(failing.URL())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink, err := webhook.New(webhook.Config{URL: tc.url, Timeout: 5 * time.Second, Logger: logger})
			if err != nil {
				t.Fatal(err)
			}
			sendErr := sink.Send(context.Background(), webhook.Request{Key: "k", Body: []byte("{}")})
			if sendErr == nil {
				t.Fatal("Send succeeded")
			}
			check(tc.name+": Send's error", sendErr.Error())

			broker := memsource.New(memsource.Config{Logger: logger})
			t.Cleanup(func() { _ = broker.Close() })
			src := broker.Source("orders")
			t.Cleanup(func() { _ = src.Close() })
			store, err := memdedup.New(memdedup.Config{})
			if err != nil {
				t.Fatal(err)
			}
			r, err := consumer.NewRunner(src, consumer.Leased(store.Leases(), sink.Handler(), consumer.LeaseOptions{}), consumer.Config{
				Name:   "notify",
				Logger: logger,
				Retry:  consumer.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond},
			})
			if err != nil {
				t.Fatal(err)
			}
			broker.Publish("orders", memsource.Outgoing{Key: "order-1", Body: []byte(`{"id":1}`)})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			for len(broker.DeadLetters("orders")) == 0 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				check(tc.name+": Run's error", err.Error())
			}
			dls := broker.DeadLetters("orders")
			if len(dls) != 1 {
				t.Fatalf("%d dead letters, want 1", len(dls))
			}
			check(tc.name+": dead-letter reason", dls[0].Reason)
			check(tc.name+": dead-letter error", dls[0].Err.Error())
		})
	}
	if !strings.Contains(logs.String(), "message dead-lettered") || !strings.Contains(logs.String(), "webhook attempt") {
		t.Fatalf("the logs lack the failures they should record:\n%s", logs.String())
	}
	check("logs", logs.String())
	t.Logf("checked %d outputs", len(outputs))
}
