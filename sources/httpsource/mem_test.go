package httpsource_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/sources/httpsource"
)

// memSource returns a Source with a runner on the in-memory store running
// h, for tests and benchmarks that need no service. The runner stops at
// cleanup.
func memSource(tb testing.TB, cfg httpsource.Config, h func(ctx context.Context, tx *memdedup.Tx, msg *consumer.Message) (httpsource.Response, error)) *httpsource.Source {
	tb.Helper()
	store, err := memdedup.New(memdedup.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	src, err := httpsource.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	r, err := consumer.NewRunner(src, consumer.Transactional[*memdedup.Tx](store, httpsource.Tx(h)),
		consumer.Config{Name: "mem", Concurrency: 4, BatchSize: 64})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				tb.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			tb.Error("Run did not return")
		}
	})
	return src
}

// serveRecorded runs one request through src and returns its recorder.
func serveRecorded(src http.Handler, key, body string, contentLength int64) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
	req.ContentLength = contentLength
	if key != "" {
		req.Header.Set(httpsource.HeaderKey, key)
	}
	w := httptest.NewRecorder()
	src.ServeHTTP(w, req)
	return w
}

// TestSourceResponseRoundTrip: a response with several headers, a
// multi-valued one, an empty value and a body larger than net/http's
// chunking buffer is answered, then replayed, with the same status,
// headers and body, and a Content-Length; with Config.ReplaySetCookie its
// cookies too.
func TestSourceResponseRoundTrip(t *testing.T) {
	body := []byte(strings.Repeat("x", 3000))
	want := http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/charges/1"},
		"Set-Cookie":   {"a=1", "b=2"},
		"X-Empty":      {""},
		"x-lower":      {"v"}, // stored canonical
	}
	src := memSource(t, httpsource.Config{Scope: oneCaller, ReplaySetCookie: true}, func(context.Context, *memdedup.Tx, *consumer.Message) (httpsource.Response, error) {
		return httpsource.Response{Status: http.StatusCreated, Header: want.Clone(), Body: body}, nil
	})
	first := serveRecorded(src, "k", `{}`, 2)
	again := serveRecorded(src, "k", `{}`, 2)
	for i, w := range []*httptest.ResponseRecorder{first, again} {
		h := w.Result().Header
		if w.Code != http.StatusCreated || w.Body.String() != string(body) {
			t.Fatalf("response %d: %d with %d bytes, want 201 with %d", i, w.Code, w.Body.Len(), len(body))
		}
		if got := h.Get("Content-Length"); got != strconv.Itoa(len(body)) {
			t.Fatalf("response %d: Content-Length %q, want %d", i, got, len(body))
		}
		if got, wantReplay := h.Get(httpsource.HeaderReplayed), map[int]string{0: "", 1: "true"}[i]; got != wantReplay {
			t.Fatalf("response %d: %s %q, want %q", i, httpsource.HeaderReplayed, got, wantReplay)
		}
		h.Del("Content-Length")
		h.Del(httpsource.HeaderReplayed)
		canon := http.Header{}
		for k, v := range want {
			canon[http.CanonicalHeaderKey(k)] = v
		}
		if fmt.Sprint(h) != fmt.Sprint(canon) {
			t.Fatalf("response %d headers %v, want %v", i, h, canon)
		}
	}
}

// TestSourceBodyLimit: a body over Config.MaxBodyBytes is answered 413
// whether its length is declared or not; a body at the limit is handled.
func TestSourceBodyLimit(t *testing.T) {
	src := memSource(t, httpsource.Config{Scope: oneCaller, MaxBodyBytes: 10}, func(_ context.Context, _ *memdedup.Tx, msg *consumer.Message) (httpsource.Response, error) {
		return httpsource.Response{Status: http.StatusCreated, Body: msg.Body}, nil
	})
	for _, c := range []struct {
		name   string
		body   string
		length int64
		status int
	}{
		{"declared over", "01234567890", 11, http.StatusRequestEntityTooLarge},
		{"undeclared over", "01234567890", -1, http.StatusRequestEntityTooLarge},
		{"declared at", "0123456789", 10, http.StatusCreated},
		{"undeclared at", "0123456789", -1, http.StatusCreated},
		{"empty", "", 0, http.StatusCreated},
	} {
		w := serveRecorded(src, "k-"+c.name, c.body, c.length)
		if w.Code != c.status {
			t.Fatalf("%s: %d %q, want %d", c.name, w.Code, w.Body, c.status)
		}
		if c.status == http.StatusCreated && w.Body.String() != c.body {
			t.Fatalf("%s: the handler got %q, want %q", c.name, w.Body, c.body)
		}
	}
}

// BenchmarkServeHTTP measures the source's own cost per request (allocs/op
// is the figure to watch): requests with new keys served through
// ServeHTTP, on a runner over the in-memory store, so that no database or
// socket time hides it. The count includes the runner's and the in-memory
// store's allocations and the test's request and recorder.
func BenchmarkServeHTTP(b *testing.B) {
	res := []byte(`{"id":1,"account":7,"amount":5,"balance":5}` + "\n")
	src := memSource(b, httpsource.Config{Scope: oneCaller}, func(context.Context, *memdedup.Tx, *consumer.Message) (httpsource.Response, error) {
		return httpsource.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: res}, nil
	})
	var seq atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w := serveRecorded(src, "k"+strconv.FormatInt(seq.Add(1), 10), `{"account":7,"amount":5}`, 24)
			if w.Code != http.StatusCreated {
				b.Errorf("status %d: %s", w.Code, w.Body)
				return
			}
		}
	})
}

// TestNewScope: a Source shares no key space between callers unless told
// to: New refuses a Config without Scope.
func TestNewScope(t *testing.T) {
	_, err := httpsource.New(httpsource.Config{})
	var ce *idemq.ConfigError
	if !errors.Is(err, idemq.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != "httpsource.Config.Scope" {
		t.Fatalf("New without Scope: %v, want a *idemq.ConfigError for httpsource.Config.Scope", err)
	}
	if _, err := httpsource.New(httpsource.Config{Scope: oneCaller, UnsafeSharedKeySpace: true}); !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Fatalf("New with Scope and UnsafeSharedKeySpace: %v, want an invalid configuration", err)
	}
	for _, cfg := range []httpsource.Config{{Scope: oneCaller}, {UnsafeSharedKeySpace: true}} {
		if _, err := httpsource.New(cfg); err != nil {
			t.Fatalf("New(%+v): %v", cfg, err)
		}
	}
}

// TestSourceClosed: after Close every request is answered 503 at once, with
// Retry-After, instead of being queued for a runner that no longer
// receives until its Timeout (the Timeout is short here, so that a queued
// request shows by its answer instead of hanging).
func TestSourceClosed(t *testing.T) {
	src, err := httpsource.New(httpsource.Config{Scope: oneCaller, Timeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		w := serveRecorded(src, fmt.Sprintf("k%d", i), `{}`, 2)
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "shutting down") {
			t.Fatalf("request %d after Close: %d %v %s, want 503 shutting down, with Retry-After", i, w.Code, w.Header(), w.Body)
		}
	}
}
