package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The worker serves its readiness and its metrics in the Prometheus format,
// with the duplicate, retry and dead-letter counters moving, and its log
// lines about messages carry their trace ids.
func TestServesHealthAndMetrics(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln, 200, &logs) }()
	base := "http://" + ln.Addr().String()

	want := []string{
		"messaging_client_consumed_messages",
		"messaging_process_duration_seconds_bucket",
		`idemq_duplicates_total{`,
		`idemq_dead_letters_total{`,
		`idemq_retries_total{`,
		"idemq_handler_duration_seconds_bucket",
		"idemq_batch_size",
		"idemq_in_flight",
	}
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var code int
		code, body = get(t, base+"/metrics")
		missing := false
		for _, w := range want {
			missing = missing || !strings.Contains(body, w)
		}
		if code == http.StatusOK && !missing {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("/metrics has no %s", w)
		}
	}
	for _, w := range []string{`idemq_duplicate_reason="`, `idemq_dead_letter_reason="permanent"`, `idemq_retry_kind="handler"`} {
		if !strings.Contains(body, w) {
			t.Errorf("/metrics has no %s", w)
		}
	}
	if code, h := get(t, base+"/healthz"); code != http.StatusOK || !strings.Contains(h, `"Ready":true`) {
		t.Errorf("/healthz: %d %s", code, h)
	}
	if !strings.Contains(logs.String(), "trace_id=") {
		t.Errorf("no log line carries a trace id:\n%s", logs.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
