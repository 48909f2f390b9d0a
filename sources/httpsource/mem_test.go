package httpsource_test

import (
	"context"
	"encoding/json"
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
	return memSourceOn(tb, cfg, httpsource.Tx(h))
}

// memSourceOn is memSource for any handler of the transactional path.
func memSourceOn(tb testing.TB, cfg httpsource.Config, h consumer.TxHandler[*memdedup.Tx]) *httpsource.Source {
	tb.Helper()
	store, err := memdedup.New(memdedup.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	src, err := httpsource.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	r, err := consumer.NewRunner(src, consumer.Transactional[*memdedup.Tx](store, h),
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
	src := memSource(t, httpsource.Config{Caller: oneCaller, ReplaySetCookie: true}, func(context.Context, *memdedup.Tx, *consumer.Message) (httpsource.Response, error) {
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
	src := memSource(t, httpsource.Config{Caller: oneCaller, MaxBodyBytes: 10}, func(_ context.Context, _ *memdedup.Tx, msg *consumer.Message) (httpsource.Response, error) {
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
	src := memSource(b, httpsource.Config{Caller: oneCaller}, func(context.Context, *memdedup.Tx, *consumer.Message) (httpsource.Response, error) {
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

// TestNewCaller: a Source shares no key space between callers unless told
// to: New refuses a Config without Caller.
func TestNewCaller(t *testing.T) {
	_, err := httpsource.New(httpsource.Config{})
	var ce *idemq.ConfigError
	if !errors.Is(err, idemq.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != "httpsource.Config.Caller" {
		t.Fatalf("New without Caller: %v, want a *idemq.ConfigError for httpsource.Config.Caller", err)
	}
	if _, err := httpsource.New(httpsource.Config{Caller: oneCaller, UnsafeSharedKeySpace: true}); !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Fatalf("New with Caller and UnsafeSharedKeySpace: %v, want an invalid configuration", err)
	}
	for _, cfg := range []httpsource.Config{{Caller: oneCaller}, {UnsafeSharedKeySpace: true}} {
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
	src, err := httpsource.New(httpsource.Config{Caller: oneCaller, Timeout: time.Millisecond})
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

// TestSourceHopByHop: hop-by-hop headers of a handler's Response belong to
// one connection: they are neither sent nor stored nor replayed. A 1xx
// status is no final answer: the request fails, nothing is stored, and the
// retry runs the handler again.
func TestSourceHopByHop(t *testing.T) {
	hop := []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Te", "Trailer", "Proxy-Authenticate", "X-Named-By-Connection"}
	var runs atomic.Int64
	src := memSource(t, httpsource.Config{Caller: oneCaller}, func(_ context.Context, _ *memdedup.Tx, msg *consumer.Message) (httpsource.Response, error) {
		runs.Add(1)
		if string(msg.Body) == "early" {
			return httpsource.Response{Status: http.StatusEarlyHints, Header: http.Header{"Link": {"</a.css>; rel=preload"}}}, nil
		}
		h := http.Header{"Location": {"/charges/1"}}
		for _, k := range hop {
			h.Set(k, "x")
		}
		h.Set("Connection", "X-Named-By-Connection")
		return httpsource.Response{Status: http.StatusCreated, Header: h, Body: []byte("ok")}, nil
	})
	for i := range 2 {
		w := serveRecorded(src, "hop", "hop", 3)
		if w.Code != http.StatusCreated || w.Header().Get("Location") != "/charges/1" {
			t.Fatalf("answer %d: %d %v, want 201 with its Location", i, w.Code, w.Header())
		}
		for _, k := range hop {
			if v, ok := w.Header()[k]; ok {
				t.Fatalf("answer %d carries the hop-by-hop header %s: %q", i, k, v)
			}
		}
	}
	for i := range 2 {
		w := serveRecorded(src, "early", "early", 5)
		if w.Code != http.StatusInternalServerError || w.Header().Get(httpsource.HeaderReplayed) != "" {
			t.Fatalf("a 103 response, request %d: %d %v %s, want 500, not stored", i, w.Code, w.Header(), w.Body)
		}
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("the handler ran %d times, want 3 (the 103 is not stored)", n)
	}
}

// TestSourceMalformedDetail: a body that does not decode is answered 400
// with a detail in the client's terms: JSON field names, never Go types or
// the runner's error text.
func TestSourceMalformedDetail(t *testing.T) {
	type chargeIn struct {
		Amount int `json:"amount"`
	}
	src := memSourceOn(t, httpsource.Config{Caller: oneCaller}, consumer.TxJSON(func(context.Context, *memdedup.Tx, *consumer.Message, chargeIn) error {
		return nil
	}))
	for body, want := range map[string]string{`{"amount":"x"}`: `"amount"`, `{"amount":`: "JSON", `[1]`: "JSON"} {
		w := serveRecorded(src, "m-"+body, body, int64(len(body)))
		var p struct{ Detail string }
		if w.Code != http.StatusBadRequest || json.Unmarshal(w.Body.Bytes(), &p) != nil || !strings.Contains(p.Detail, want) {
			t.Fatalf("body %s: %d %s, want 400 with a detail naming %s", body, w.Code, w.Body, want)
		}
		for _, internal := range []string{"Go ", "idemq", "int", "chargeIn", "json:"} {
			if strings.Contains(p.Detail, internal) {
				t.Fatalf("body %s: detail %q tells %q", body, p.Detail, internal)
			}
		}
	}
}
