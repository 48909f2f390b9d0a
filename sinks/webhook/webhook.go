package webhook

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/sinks"
)

// DefaultKeyHeader is Config.KeyHeader's default: the request header a
// receiver reads the idempotency key from.
const DefaultKeyHeader = "Idempotency-Key"

// errorBodyBytes is how much of a failed response's body an error quotes;
// drainBytes is how much of any response is read so the connection can be
// reused.
const (
	errorBodyBytes = 512
	drainBytes     = 64 << 10
)

// Config configures a Sink.
type Config struct {
	// URL is the endpoint every request goes to (http or https). Required.
	URL string

	// Method is the HTTP method. Defaults to POST.
	Method string

	// Header holds headers sent with every request, such as Authorization.
	// Content-Type and the key header are set by the sink. Defaults to none.
	Header http.Header

	// ContentType is the Content-Type of the body. Defaults to
	// "application/json".
	ContentType string

	// KeyHeader is the header that carries the idempotency key. Defaults
	// to "Idempotency-Key".
	KeyHeader string

	// Timeout bounds one attempt, from sending the request to reading the
	// response headers; a timed-out attempt is retried. Defaults to 10 s.
	Timeout time.Duration

	// MaxRetryAfter caps the delay a Retry-After response header can ask
	// for, so that a misbehaving server cannot park a message for days.
	// Defaults to 1 h.
	MaxRetryAfter time.Duration

	// Client sends the requests. Defaults to a client that does not follow
	// redirects: a 3xx answer is a permanent failure, because following it
	// could turn a POST into a GET and drop the body. A custom client keeps
	// its own redirect policy.
	Client *http.Client

	// Logger receives one debug record per attempt (key, status, duration).
	// Defaults to a logger that discards everything.
	Logger *slog.Logger

	// Propagator writes the trace context of the context Send is given
	// (the handler's span) into each request's headers, so that the
	// receiver's spans join the message's trace: otelidemq.Propagator()
	// writes what the application's global propagator does, or W3C trace
	// context and baggage while none is set. A propagator with no fields
	// (propagation.NewCompositeTextMapPropagator()) writes nothing.
	// Defaults to W3C trace context (propagation.TraceContext), which
	// writes traceparent and tracestate when the context carries a span.
	Propagator propagation.TextMapPropagator
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Method = cmp.Or(c.Method, http.MethodPost)
	c.ContentType = cmp.Or(c.ContentType, "application/json")
	c.KeyHeader = cmp.Or(c.KeyHeader, DefaultKeyHeader)
	c.Timeout = cmp.Or(c.Timeout, 10*time.Second)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, time.Hour)
	if c.Client == nil {
		c.Client = &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	c.Propagator = cmp.Or[propagation.TextMapPropagator](c.Propagator, propagation.TraceContext{})
	return c
}

// validate reports every invalid field of c, and returns the parsed URL.
func (c Config) validate() (*url.URL, error) {
	l := cfgerr.List{Prefix: "webhook.Config."}
	var u *url.URL
	if c.URL == "" {
		l.Add("URL", "required")
	} else if p, err := url.Parse(c.URL); err != nil {
		l.AddErr("URL", "", redact.URLError(err))
	} else if p.Scheme != "http" && p.Scheme != "https" {
		l.Addf("URL", "%q: scheme must be http or https", redact.URL(p))
	} else if p.Host == "" {
		l.Addf("URL", "%q has no host", redact.URL(p))
	} else {
		u = p
	}
	if c.Method == http.MethodGet || c.Method == http.MethodHead || strings.ContainsAny(c.Method, " \t\r\n") {
		l.Addf("Method", "%q cannot carry an effect", c.Method)
	}
	if http.CanonicalHeaderKey(c.KeyHeader) == "Content-Type" || strings.ContainsAny(c.KeyHeader, " :\t\r\n") {
		l.Addf("KeyHeader", "%q is not usable", c.KeyHeader)
	}
	if err := checkHeader(c.Header); err != nil {
		l.AddErr("Header", "", err)
	}
	l.NotNegative("Timeout", c.Timeout)
	l.NotNegative("MaxRetryAfter", c.MaxRetryAfter)
	return u, l.Err()
}

// Sink sends webhooks for the lease path. Every attempt of one message
// carries the same idempotency key, consumer.IdempotencyKey(ctx), in
// Config.KeyHeader, so the receiver can deduplicate the repeats the lease
// path cannot rule out. A Sink is safe for concurrent use.
type Sink struct {
	cfg      Config
	endpoint string // the URL redacted (internal/redact), for errors and logs
}

// New returns a Sink for cfg after WithDefaults, or an error matching
// idemq.ErrInvalidConfig that names every bad field. It does not contact the
// endpoint.
func New(cfg Config) (*Sink, error) {
	cfg = cfg.WithDefaults()
	u, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	cfg.Header = cfg.Header.Clone()
	return &Sink{cfg: cfg, endpoint: redact.URL(u)}, nil
}

// Config returns the sink's configuration with defaults applied.
func (s *Sink) Config() Config { return s.cfg }

// Request is one webhook call.
type Request struct {
	// Body is the request body.
	Body []byte
	// Header holds extra headers for this call; they override
	// Config.Header. Content-Type and the key header are set by the sink.
	Header http.Header
	// Key is the idempotency key. Leave it empty inside a Runner: the sink
	// then sends consumer.IdempotencyKey(ctx), which is the same on every attempt.
	// Set it only outside a Runner, and only to a value as stable as that.
	Key string
}

// Send performs one attempt of req and returns nil, an error wrapped with
// consumer.RetryAfter or consumer.Permanent, or a plain error (retried with
// the runner's backoff), as "Outcomes" in the package documentation lists.
// Send never retries by itself and never changes the key.
func (s *Sink) Send(ctx context.Context, req Request) error {
	key, err := sinks.Key(ctx, req.Key)
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	actx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(actx, s.cfg.Method, s.cfg.URL, bytes.NewReader(req.Body))
	if err != nil {
		return consumer.Permanent(fmt.Errorf("webhook: building the request: %w", err))
	}
	for _, h := range []http.Header{s.cfg.Header, req.Header} { // req.Header overrides
		for k, vs := range h {
			hr.Header[http.CanonicalHeaderKey(k)] = vs
		}
	}
	hr.Header.Set("Content-Type", s.cfg.ContentType)
	hr.Header.Set(s.cfg.KeyHeader, key)
	// The handler's span continues downstream.
	s.cfg.Propagator.Inject(ctx, propagation.HeaderCarrier(hr.Header))
	if err := checkHeader(hr.Header); err != nil {
		// net/http would refuse it on every attempt.
		return consumer.Permanent(fmt.Errorf("webhook: building the request: %w", err))
	}

	start := time.Now()
	resp, err := s.cfg.Client.Do(hr)
	if err != nil {
		err = redact.URLError(err) // it quotes the whole URL: tokens in its path or query
		s.cfg.Logger.DebugContext(ctx, "webhook attempt failed", "key", key, "url", s.endpoint,
			"duration", time.Since(start), "err", err)
		if ctx.Err() != nil {
			// The runner gave up on this attempt (lease lost, handler
			// timeout, shutdown); the error says why.
			err = context.Cause(ctx)
		}
		return fmt.Errorf("webhook: %s %s (key %q): %w", s.cfg.Method, s.endpoint, key, err)
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyBytes))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBytes))
	s.cfg.Logger.DebugContext(ctx, "webhook attempt", "key", key, "url", s.endpoint,
		"status", resp.StatusCode, "duration", time.Since(start))

	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	serr := &StatusError{Method: s.cfg.Method, URL: s.endpoint, Key: key, StatusCode: resp.StatusCode,
		Body: strings.ToValidUTF8(string(snippet), "\uFFFD"), Retryable: retryable(resp.StatusCode)}
	if !serr.Retryable {
		return consumer.Permanent(serr)
	}
	if d, ok := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok && d > 0 {
		serr.RetryAfter = min(d, s.cfg.MaxRetryAfter)
		return consumer.RetryAfter(serr.RetryAfter, serr)
	}
	return serr
}

// ErrInvalidHeader is matched by the error of Send for a header name or value
// that HTTP cannot carry (a control character such as CR or LF, a name that
// is not a token). It is wrapped with consumer.Permanent: no retry can fix it.
var ErrInvalidHeader = errors.New("webhook: invalid header")

// checkHeader rejects what net/http's transport would refuse to send, so that
// the refusal is reported as permanent instead of being retried: names must
// be RFC 9110 tokens, values must hold no control character but tab.
func checkHeader(h http.Header) error {
	for name, vs := range h {
		if name == "" || strings.IndexFunc(name, func(r rune) bool { return !isTokenRune(r) }) >= 0 {
			return fmt.Errorf("%w: name %q", ErrInvalidHeader, name)
		}
		for _, v := range vs {
			if i := strings.IndexFunc(v, func(r rune) bool { return r != '\t' && (r < 0x20 || r == 0x7f) }); i >= 0 {
				return fmt.Errorf("%w: value of %s has control character %#02x at byte %d", ErrInvalidHeader, name, v[i], i)
			}
		}
	}
	return nil
}

// isTokenRune reports whether r may appear in an HTTP token (RFC 9110 5.6.2).
func isTokenRune(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return r < 0x80 && strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

// Handler returns a consumer.Handler that sends each message's body as it is,
// with the message's idempotency key. To build the body from the message,
// call Send from a handler of your own (consumer.JSON decodes it).
func (s *Sink) Handler() consumer.Handler {
	return func(ctx context.Context, msg *consumer.Message) error {
		return s.Send(ctx, Request{Body: msg.Body})
	}
}

// StatusError is the error of a webhook answered with a status other than
// 2xx. Send wraps it with consumer.Permanent or consumer.RetryAfter;
// errors.As finds it through those wrappers.
type StatusError struct {
	Method     string
	URL        string // scheme, user, host and port; password, path and query masked
	Key        string // the idempotency key sent
	StatusCode int
	Body       string // the start of the response body
	// Retryable reports whether the status is retried (408, 409, 425, 429,
	// 5xx) rather than dead-lettered.
	Retryable bool
	// RetryAfter is the delay the server asked for in Retry-After, capped,
	// or zero.
	RetryAfter time.Duration
}

// Error implements error.
func (e *StatusError) Error() string {
	msg := fmt.Sprintf("webhook: %s %s (key %q): %d %s", e.Method, e.URL, e.Key, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Body != "" {
		msg += ": " + strings.TrimSpace(e.Body)
	}
	return msg
}

// retryable reports whether an HTTP status means "try again later" for an
// effect with an idempotency key: 408, 409 (the receiver is still
// processing a request with the same key), 425, 429 and every 5xx.
func retryable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status >= 500
}

// ParseRetryAfter parses a Retry-After header value, either delay-seconds or
// an HTTP-date, into a delay from now. It reports false for an empty or
// malformed value; a date in the past gives a zero delay.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(24*365*time.Hour/time.Second))) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}
