package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sinks"
	"github.com/idemq/idemq/sinks/webhook"
	"github.com/idemq/idemq/sinks/webhook/webhooktest"
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newSink(t *testing.T, cfg webhook.Config) *webhook.Sink {
	t.Helper()
	s, err := webhook.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func TestNewValidatesConfig(t *testing.T) {
	for name, cfg := range map[string]webhook.Config{
		"no URL":           {},
		"relative URL":     {URL: "/hook"},
		"ftp URL":          {URL: "ftp://127.0.0.1/hook"},
		"GET":              {URL: "http://127.0.0.1/hook", Method: http.MethodGet},
		"bad key header":   {URL: "http://127.0.0.1/hook", KeyHeader: "Idempotency Key"},
		"negative timeout": {URL: "http://127.0.0.1/hook", Timeout: -time.Second},
		"header with LF":   {URL: "http://127.0.0.1/hook", Header: http.Header{"Authorization": {"Bearer x\nX-Injected: 1"}}},
	} {
		if _, err := webhook.New(cfg); !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want idemq.ErrInvalidConfig", name, err)
		}
	}
	s := newSink(t, webhook.Config{URL: "http://127.0.0.1/hook"})
	got := s.Config()
	if got.Method != http.MethodPost || got.KeyHeader != "Idempotency-Key" || got.Timeout != 10*time.Second ||
		got.ContentType != "application/json" || got.Client == nil || got.Logger == nil {
		t.Fatalf("defaults not applied: %+v", got)
	}
}

func TestSendCarriesKeyAndHeaders(t *testing.T) {
	var seen http.Header
	rcv := webhooktest.New(t, func(c webhooktest.Call) webhooktest.Response {
		seen = c.Request.Header.Clone()
		return webhooktest.Response{Status: http.StatusCreated}
	})
	s := newSink(t, webhook.Config{
		URL:    rcv.URL() + "/hook?token=secret",
		Header: http.Header{"authorization": {"Bearer abc"}},
	})
	err := s.Send(testContext(t), webhook.Request{Key: "order-1", Body: []byte(`{"n":1}`), Header: http.Header{"X-Trace": {"t1"}}})
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	if seen.Get("Idempotency-Key") != "order-1" || seen.Get("Authorization") != "Bearer abc" ||
		seen.Get("X-Trace") != "t1" || seen.Get("Content-Type") != "application/json" {
		t.Fatalf("request headers = %v", seen)
	}
	if got := rcv.Bodies("order-1"); len(got) != 1 || string(got[0]) != `{"n":1}` {
		t.Fatalf("bodies = %q", got)
	}
	// A request header cannot replace the key.
	err = s.Send(testContext(t), webhook.Request{Key: "order-2", Header: http.Header{"Idempotency-Key": {"forged"}}})
	if err != nil || seen.Get("Idempotency-Key") != "order-2" {
		t.Fatalf("Send with a forged key header: err %v, key sent %q", err, seen.Get("Idempotency-Key"))
	}
}

func TestSendWithoutKeyIsPermanent(t *testing.T) {
	rcv := webhooktest.New(t, nil)
	s := newSink(t, webhook.Config{URL: rcv.URL()})
	err := s.Send(testContext(t), webhook.Request{Body: []byte("{}")})
	if !errors.Is(err, sinks.ErrNoKey) || !consumer.IsPermanent(err) {
		t.Fatalf("Send without a key: err = %v, want a permanent ErrNoKey", err)
	}
	if rcv.TotalCalls() != 0 {
		t.Fatal("a request without a key was sent")
	}
}

func TestClassification(t *testing.T) {
	type want int
	const (
		done want = iota
		retry
		permanent
	)
	cases := []struct {
		status     int
		retryAfter string
		want       want
		delay      time.Duration
	}{
		{200, "", done, 0},
		{202, "", done, 0},
		{204, "", done, 0},
		{301, "", permanent, 0},
		{307, "", permanent, 0},
		{400, "", permanent, 0},
		{401, "", permanent, 0},
		{404, "", permanent, 0},
		{422, "", permanent, 0},
		{408, "", retry, 0},
		{409, "", retry, 0},
		{409, "2", retry, 2 * time.Second},
		{425, "", retry, 0},
		{429, "", retry, 0},
		{429, "7", retry, 7 * time.Second},
		{429, "86400", retry, time.Hour}, // capped at MaxRetryAfter
		{429, "soon", retry, 0},          // malformed: backoff
		{500, "", retry, 0},
		{502, "", retry, 0},
		{503, "0", retry, 0},
		{503, "120", retry, 2 * time.Minute},
		{504, "", retry, 0},
	}
	for _, tc := range cases {
		rcv := webhooktest.New(t, func(webhooktest.Call) webhooktest.Response {
			h := http.Header{}
			if tc.retryAfter != "" {
				h.Set("Retry-After", tc.retryAfter)
			}
			h.Set("Location", "/elsewhere")
			return webhooktest.Response{Status: tc.status, Header: h, Body: "why: reasons"}
		})
		s := newSink(t, webhook.Config{URL: rcv.URL()})
		err := s.Send(testContext(t), webhook.Request{Key: "k"})
		var se *webhook.StatusError
		switch tc.want {
		case done:
			if err != nil {
				t.Errorf("%d: err = %v, want nil", tc.status, err)
			}
			continue
		case retry:
			if err == nil || consumer.IsPermanent(err) {
				t.Errorf("%d Retry-After %q: err = %v, want a retryable error", tc.status, tc.retryAfter, err)
				continue
			}
		case permanent:
			if !consumer.IsPermanent(err) {
				t.Errorf("%d: err = %v, want a permanent error", tc.status, err)
				continue
			}
		}
		if !errors.As(err, &se) || se.StatusCode != tc.status || se.Key != "k" || se.RetryAfter != tc.delay ||
			se.Retryable != (tc.want == retry) || !strings.Contains(se.Error(), "why: reasons") {
			t.Errorf("%d Retry-After %q: StatusError = %+v, want delay %v", tc.status, tc.retryAfter, se, tc.delay)
		}
		if rcv.Calls("k") != 1 {
			t.Errorf("%d: %d calls, want 1 (the sink never retries by itself nor follows redirects)", tc.status, rcv.Calls("k"))
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"5", 5 * time.Second, true},
		{" 5 ", 5 * time.Second, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"Sun, 01 Mar 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Sun, 01 Mar 2026 11:00:00 GMT", 0, true},
		{"tomorrow", 0, false},
	} {
		got, ok := webhook.ParseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestTimeoutIsRetried(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	rcv := webhooktest.New(t, func(c webhooktest.Call) webhooktest.Response {
		select {
		case <-c.Request.Context().Done():
		case <-release:
		}
		return webhooktest.Response{Status: http.StatusOK}
	})
	s := newSink(t, webhook.Config{URL: rcv.URL(), Timeout: 50 * time.Millisecond})
	err := s.Send(testContext(t), webhook.Request{Key: "slow"})
	if err == nil || consumer.IsPermanent(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send to a receiver slower than Timeout: err = %v, want a retryable deadline error", err)
	}
}

func TestCancelledContextReportsCause(t *testing.T) {
	rcv := webhooktest.New(t, func(c webhooktest.Call) webhooktest.Response {
		<-c.Request.Context().Done()
		return webhooktest.Response{}
	})
	s := newSink(t, webhook.Config{URL: rcv.URL()})
	cause := errors.New("lease lost")
	ctx, cancel := context.WithCancelCause(testContext(t))
	time.AfterFunc(20*time.Millisecond, func() { cancel(cause) })
	if err := s.Send(ctx, webhook.Request{Key: "k"}); !errors.Is(err, cause) || consumer.IsPermanent(err) {
		t.Fatalf("Send cancelled by the runner: err = %v, want the retryable cause", err)
	}
}

func TestUnreachableIsRetried(t *testing.T) {
	// The receiver of a finished subtest is closed: nothing listens on its
	// port any more.
	var url string
	t.Run("receiver", func(t *testing.T) { url = webhooktest.New(t, nil).URL() })
	s := newSink(t, webhook.Config{URL: url})
	if err := s.Send(testContext(t), webhook.Request{Key: "k"}); err == nil || consumer.IsPermanent(err) {
		t.Fatalf("Send to a closed port: err = %v, want a retryable error", err)
	}
}

// A request that net/http refuses to send can never succeed: it is a
// permanent failure, not a retry until ErrMaxAttempts, and nothing is sent.
func TestUnsendableRequestIsPermanent(t *testing.T) {
	rcv := webhooktest.New(t, nil)
	s := newSink(t, webhook.Config{URL: rcv.URL()})
	for name, req := range map[string]webhook.Request{
		"key with CRLF":           {Body: []byte("{}"), Key: "k\r\nX-Injected: 1"},
		"key with LF":             {Body: []byte("{}"), Key: "k\nx"},
		"header value with CR":    {Body: []byte("{}"), Key: "k", Header: http.Header{"X-Trace": {"a\rb"}}},
		"header name not a token": {Body: []byte("{}"), Key: "k", Header: http.Header{"X Trace": {"a"}}},
	} {
		err := s.Send(testContext(t), req)
		if !errors.Is(err, webhook.ErrInvalidHeader) || !consumer.IsPermanent(err) {
			t.Errorf("%s: err = %v, want a permanent ErrInvalidHeader", name, err)
		}
	}
	if n := rcv.TotalCalls(); n != 0 {
		t.Fatalf("%d requests reached the receiver", n)
	}
	// A tab is allowed in a value.
	if err := s.Send(testContext(t), webhook.Request{Body: []byte("{}"), Key: "k", Header: http.Header{"X-Trace": {"a\tb"}}}); err != nil {
		t.Fatalf("value with a tab: %v", err)
	}
}

// tracedContext returns a context carrying a sampled span context.
func tracedContext(t *testing.T) context.Context {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	return trace.ContextWithSpanContext(testContext(t), sc)
}

// headerPropagator writes the span ID in X-Span, as a propagator other
// than W3C trace context would.
type headerPropagator struct{}

func (headerPropagator) Inject(ctx context.Context, c propagation.TextMapCarrier) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		c.Set("X-Span", sc.SpanID().String())
	}
}
func (headerPropagator) Extract(ctx context.Context, _ propagation.TextMapCarrier) context.Context {
	return ctx
}
func (headerPropagator) Fields() []string { return []string{"X-Span"} }

// Config.Propagator writes the trace context in place of W3C trace
// context; a propagator with no fields writes none.
func TestSendPropagator(t *testing.T) {
	var seen http.Header
	rcv := webhooktest.New(t, func(c webhooktest.Call) webhooktest.Response {
		seen = c.Request.Header.Clone()
		return webhooktest.Response{Status: http.StatusOK}
	})
	s := newSink(t, webhook.Config{URL: rcv.URL(), Propagator: headerPropagator{}})
	if err := s.Send(tracedContext(t), webhook.Request{Key: "k1"}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if got, tp := seen.Get("X-Span"), seen.Get("Traceparent"); got != "00f067aa0ba902b7" || tp != "" {
		t.Fatalf("X-Span %q, traceparent %q; want the span ID and no traceparent", got, tp)
	}
	s = newSink(t, webhook.Config{URL: rcv.URL(), Propagator: propagation.NewCompositeTextMapPropagator()})
	if err := s.Send(tracedContext(t), webhook.Request{Key: "k2"}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if tp := seen.Get("Traceparent"); tp != "" {
		t.Fatalf("traceparent %q sent with an empty propagator", tp)
	}
}

// A request sent from a traced handler carries its span as a W3C
// traceparent header by default, so that the receiver's spans join the
// message's trace; without a span there is none.
func TestSendCarriesTraceparent(t *testing.T) {
	var seen http.Header
	rcv := webhooktest.New(t, func(c webhooktest.Call) webhooktest.Response {
		seen = c.Request.Header.Clone()
		return webhooktest.Response{Status: http.StatusOK}
	})
	s := newSink(t, webhook.Config{URL: rcv.URL()})
	if err := s.Send(testContext(t), webhook.Request{Key: "k0"}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if tp := seen.Get("Traceparent"); tp != "" {
		t.Fatalf("traceparent %q sent without a span", tp)
	}
	if err := s.Send(tracedContext(t), webhook.Request{Key: "k1"}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if got, want := seen.Get("Traceparent"), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; got != want {
		t.Fatalf("traceparent %q, want %q", got, want)
	}
}
