package kafkasource_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/kafkasource"
)

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// New against a closed port fails at once and says why, instead of returning
// a source that waits in silence.
func TestNewFailsWhenNoBrokerAnswers(t *testing.T) {
	addr := closedPort(t)
	cfg := kafkasource.Config{Brokers: []string{addr}, Topics: []string{"t"}, GroupID: "g", ConnectTimeout: 2 * time.Second}
	src, err := kafkasource.New(t.Context(), cfg)
	if err == nil {
		_ = src.Close()
		t.Fatal("New succeeded against a closed port")
	}
	if !errors.Is(err, kafkasource.ErrUnreachable) || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("New = %v, want ErrUnreachable naming %s and the dial error", err, addr)
	}
	cfg.ConnectTimeout = -1 // opt out of the check
	src, err = kafkasource.New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("New without the check: %v", err)
	}
	_ = src.Close()
}

// Ping answers for a reachable cluster.
func TestPing(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	src := openSource(t, testConfig(t, brokers, "idemq-ping", runtest.UniqueName(t, "g")))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

// A cluster that becomes unreachable after New (here: never was, with the
// check skipped) shows as failed receives: the runner logs one ERROR line
// naming the broker and reports it in Health.
func TestUnreachableClusterShowsInRunnerHealth(t *testing.T) {
	addr := closedPort(t)
	src, err := kafkasource.New(t.Context(), kafkasource.Config{
		Brokers: []string{addr}, Topics: []string{"t"}, GroupID: "g",
		ConnectTimeout: -1, JoinGroupBackoff: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	store, err := memdedup.New(memdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var logs runtest.SyncBuffer
	r, err := consumer.NewRunner(src, consumer.Transactional(store, func(context.Context, *memdedup.Tx, *consumer.Message) error { return nil }),
		consumer.Config{
			Name: "unreachable", Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			Retry: consumer.RetryPolicy{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
		})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for r.Health().ReceiveFailures < r.Config().OutageThreshold && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	h := r.Health()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if h.Ready || h.ReceiveFailures < r.Config().OutageThreshold {
		t.Fatalf("health %+v: want the receive failures counted and not ready", h)
	}
	if out := logs.String(); !strings.Contains(out, `level=ERROR msg="dependency failing" consumer=unreachable dependency=broker`) ||
		!strings.Contains(out, "connection refused") {
		t.Fatalf("no ERROR line naming the broker and the error:\n%s", out)
	}
}
