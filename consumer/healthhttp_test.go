package consumer_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// HealthHandler serves liveness (always 200 while the process answers) and
// readiness (Runner.Health as JSON, 200 when Ready, 503 otherwise) under
// whatever prefix it is mounted at.
func TestHealthHandler(t *testing.T) {
	store := memStore(t)
	b := memBroker(t, memsource.Config{})
	r := newRunner(t, b.Source("orders"), consumer.Transactional(store, func(context.Context, *memdedup.Tx, *consumer.Message) error { return nil }),
		consumer.Config{Name: "health"})
	mux := http.NewServeMux()
	mux.Handle("/health/", http.StripPrefix("/health", consumer.HealthHandler(r)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	call := func(method, path string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	ready := func() (int, consumer.Health) {
		t.Helper()
		code, body := call(http.MethodGet, "/health/readyz")
		var h consumer.Health
		if err := json.Unmarshal([]byte(body), &h); err != nil {
			t.Fatalf("readyz body %q: %v", body, err)
		}
		return code, h
	}

	if code, h := ready(); code != http.StatusServiceUnavailable || h.Ready || h.Running {
		t.Errorf("before Run: readyz %d %+v, want 503 and not ready", code, h)
	}
	if code, _ := call(http.MethodGet, "/health/livez"); code != http.StatusOK {
		t.Errorf("before Run: livez %d, want 200", code)
	}

	runtest.Start(t, r)
	deadline := time.Now().Add(10 * time.Second)
	for !r.Health().Ready {
		if time.Now().After(deadline) {
			t.Fatalf("runner not ready: %+v", r.Health())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if code, h := ready(); code != http.StatusOK || !h.Ready || !h.Running {
		t.Errorf("running: readyz %d %+v, want 200 and ready", code, h)
	}
	if code, _ := call(http.MethodHead, "/health/readyz"); code != http.StatusOK {
		t.Errorf("running: HEAD readyz %d, want 200", code)
	}
	if code, body := call(http.MethodGet, "/health/livez"); code != http.StatusOK || !strings.Contains(body, "ok") {
		t.Errorf("running: livez %d %q, want 200 ok", code, body)
	}
	if code, _ := call(http.MethodGet, "/health/nope"); code != http.StatusNotFound {
		t.Errorf("unknown path: %d, want 404", code)
	}
	if code, _ := call(http.MethodPost, "/health/readyz"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST readyz: %d, want 405", code)
	}
}
