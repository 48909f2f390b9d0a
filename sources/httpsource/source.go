package httpsource

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/cfgerr"
)

// Header names of the IETF draft "The Idempotency-Key HTTP Header Field"
// and of the replay mark (Stripe's).
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// Config configures a Source. Caller is required, unless
// UnsafeSharedKeySpace says that every caller shares one key space.
type Config struct {
	// Caller names who sent a request, for example the authenticated
	// subject or tenant: keys are recorded per caller, encoded
	// injectively, so that no caller can read another's stored response by
	// sending the same key. An error answers 401 with its text as the
	// problem detail; so does an empty caller, or one that is not UTF-8 or
	// holds a control character. Required: New fails without it, unless
	// UnsafeSharedKeySpace is set.
	Caller func(r *http.Request) (string, error)

	// UnsafeSharedKeySpace records every caller's keys in one key space,
	// without a Caller: a caller who sends a key another caller used gets
	// that caller's stored response, or a 422 that tells him the key
	// exists. Set it only when one client owns the endpoint. Defaults to
	// false: New fails without a Caller.
	UnsafeSharedKeySpace bool

	// ReplaySetCookie stores the Set-Cookie headers of a handler's
	// Response with it and replays them to retries. Defaults to false: a
	// Set-Cookie goes to the request whose handler returned it alone.
	ReplaySetCookie bool

	// KeyOptional accepts requests without an Idempotency-Key: each one
	// runs as a new operation under a generated key. Defaults to false: a
	// request without a key is answered 400.
	KeyOptional bool

	// WaitInProgress makes a request whose key is being handled by an
	// earlier request to this Source wait for it and then get its
	// response as a replay, instead of an immediate 409 Conflict. Defaults
	// to false (409, as the draft recommends).
	WaitInProgress bool

	// MaxBodyBytes is the largest request body accepted; larger requests
	// are answered 413. Defaults to 1 MiB.
	MaxBodyBytes int64

	// Timeout bounds how long a request waits for the runner to settle it,
	// including the retries the runner asks for (a database outage, a
	// handler's retryable error); after it the request is answered 503
	// with Retry-After, and a retry with the same key finds out what
	// happened. Defaults to 30 s.
	Timeout time.Duration

	// Queue is how many requests may wait for the runner to receive them;
	// more are answered 503 with Retry-After: 1 at once. Defaults to 1024.
	Queue int

	// Logger receives the source's logs. Defaults to a logger that
	// discards everything.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, 1<<20)
	c.Timeout = cmp.Or(c.Timeout, 30*time.Second)
	c.Queue = cmp.Or(c.Queue, 1024)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

func (c Config) validate() error {
	var l cfgerr.List
	switch {
	case c.Caller == nil && !c.UnsafeSharedKeySpace:
		l.Add("httpsource.Config.Caller", "nil: name the request's caller (or set UnsafeSharedKeySpace, when one client owns the endpoint)")
	case c.Caller != nil && c.UnsafeSharedKeySpace:
		l.Add("httpsource.Config.UnsafeSharedKeySpace", "set together with Caller: choose one")
	}
	if c.MaxBodyBytes < 0 {
		l.Addf("httpsource.Config.MaxBodyBytes", "%d is negative", c.MaxBodyBytes)
	}
	if c.Timeout < 0 {
		l.Addf("httpsource.Config.Timeout", "%s is negative", c.Timeout)
	}
	if c.Queue < 0 {
		l.Addf("httpsource.Config.Queue", "%d is negative", c.Queue)
	}
	return l.Err()
}

// Source turns HTTP requests into deliveries of a consumer.Source: mount it
// on the route of one endpoint (it is an http.Handler) and run a
// consumer.Runner on it, with the endpoint's handler (Tx or Lease). Each
// request waits until the runner settles its delivery and is answered from
// the outcome; docs/http.md lists every status it answers.
//
// Shut down in this order: http.Server.Shutdown (it waits for the requests
// in flight, which wait for the runner), then cancel the runner's context.
// It is safe for concurrent use.
type Source struct {
	cfg    Config
	queue  chan *consumer.Message
	closed chan struct{}
	once   sync.Once
	seq    atomic.Uint64

	// qmu is held for reading to queue a request and for writing to
	// close: no request is queued once Close has begun.
	qmu      sync.RWMutex
	isClosed bool

	mu       sync.Mutex
	inFlight map[string]*pending // by recorded key
}

// pending is a request waiting for its outcome. It is in progress (in
// Source.inFlight) from its arrival until it is settled: answered by the
// runner, refused, or out of time. A client that leaves does not end it.
type pending struct {
	src      *Source
	key      string
	deadline time.Time
	settled  atomic.Bool
	answer   chan Response // buffered 1; the first settle wins
	done     chan struct{} // closed when the request is settled

	// Set by the handler's adapter (Tx, Lease, Respond) when it encodes
	// the Response, read when the request is settled.
	replayCookies bool     // Config.ReplaySetCookie
	cookies       []string // Set-Cookie held back from the store
	tx            bool     // Tx or Respond encoded the Response: it commits with the effect
	leased        []byte   // Lease's encoded Response: its effect happened
}

var (
	_ consumer.Source   = (*Source)(nil)
	_ consumer.Releaser = (*Source)(nil)
	_ http.Handler      = (*Source)(nil)
)

// New returns a Source. A bad Config fails with an error matching
// idemq.ErrInvalidConfig.
func New(cfg Config) (*Source, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Source{
		cfg:      cfg,
		queue:    make(chan *consumer.Message, cfg.Queue),
		closed:   make(chan struct{}),
		inFlight: map[string]*pending{},
	}, nil
}

// callerEscaper makes "<caller>:<key>" injective, as consumer.IdempotencyKey
// does: the escaped caller holds no ':'.
var callerEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// ServeHTTP implements http.Handler: it answers the request from the
// outcome of its delivery.
func (s *Source) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, status, detail := s.requestKey(r)
	if status != 0 {
		problem(w, status, detail)
		return
	}
	fp, body, err := readFingerprint(w, r, s.cfg.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			problem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", s.cfg.MaxBodyBytes))
			return
		}
		s.cfg.Logger.DebugContext(r.Context(), "reading a request body failed", "err", err)
		problem(w, http.StatusBadRequest, "reading the request body failed")
		return
	}
	for {
		p, busy := s.begin(key)
		if busy == nil {
			s.serve(w, r, p, key, fp, body)
			return
		}
		if !s.cfg.WaitInProgress {
			problem(w, http.StatusConflict, busyDetail)
			return
		}
		select {
		case <-busy.done: // now a duplicate: its replay
		case <-r.Context().Done():
			return
		}
	}
}

// readFingerprint reads r's body, at most limit bytes, into r's
// fingerprint, what identifies a request for its key's payload check
// (consumer.Message.Fingerprint): the method and the target (the path with
// its values, and the query) on one line, then the body. The method and
// the escaped target hold no LF, so the first LF ends them and two
// requests have equal fingerprints only if all three are equal. body is
// the fingerprint's tail, not a copy, without room to append to it.
func readFingerprint(w http.ResponseWriter, r *http.Request, limit int64) (fp, body []byte, err error) {
	head := r.Method + " " + r.URL.RequestURI() + "\n"
	size := len(head) + 512
	if n := r.ContentLength; n >= 0 && n <= limit {
		size = len(head) + int(n) + 1 // +1: the read that finds EOF needs room
	}
	b := append(make([]byte, 0, size), head...)
	rd := http.MaxBytesReader(w, r.Body, limit)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := rd.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, b[len(head):len(b):len(b)], nil
		}
		if err != nil {
			return nil, nil, err
		}
	}
}

// busyDetail is the 409 problem's detail for a key in progress.
const busyDetail = "a request with this " + HeaderKey + " is still being processed; retry later"

// requestKey returns the key to record for r, or the status and problem
// detail that refuse r.
func (s *Source) requestKey(r *http.Request) (key string, status int, detail string) {
	key = r.Header.Get(HeaderKey)
	if len(key) >= 2 && key[0] == '"' && key[len(key)-1] == '"' {
		key = key[1 : len(key)-1] // the draft's sf-string form
	}
	if key == "" {
		if !s.cfg.KeyOptional {
			return "", http.StatusBadRequest, "the " + HeaderKey + " header is required"
		}
		key = fmt.Sprintf("generated:%d:%d", time.Now().UnixNano(), s.seq.Add(1))
	}
	if len(key) > consumer.MaxKeyBytes {
		return "", http.StatusBadRequest, fmt.Sprintf("the %s is longer than %d bytes", HeaderKey, consumer.MaxKeyBytes)
	}
	if p := textProblem(key); p != "" {
		return "", http.StatusBadRequest, "the " + HeaderKey + " " + p
	}
	if s.cfg.Caller == nil {
		return key, 0, ""
	}
	caller, err := s.cfg.Caller(r)
	switch {
	case err != nil:
		return "", http.StatusUnauthorized, err.Error()
	case caller == "":
		return "", http.StatusUnauthorized, "the request names no caller"
	}
	if p := textProblem(caller); p != "" {
		s.cfg.Logger.WarnContext(r.Context(), "caller refused", "reason", p)
		return "", http.StatusUnauthorized, "the caller " + p
	}
	return callerKey(caller, key), 0, ""
}

// textProblem says why a key or a caller cannot be recorded, or returns "":
// it is not UTF-8, or holds a control character, as the runner's check of
// keys says.
func textProblem(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "is not UTF-8"
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return "holds a control character"
	}
	return ""
}

// callerKey is the key recorded for key of caller: "<caller>:<key>", with
// '%' and ':' of the caller escaped. When that is longer than
// consumer.MaxKeyBytes (the limit is the key's, not the caller's), it is
// "%sha256:" and the hex SHA-256 digest of it instead: an escaped caller
// has a '%' only before "25" or "3A", so no "<caller>:<key>" starts so.
func callerKey(caller, key string) string {
	k := callerEscaper.Replace(caller) + ":" + key
	if len(k) <= consumer.MaxKeyBytes {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return "%sha256:" + hex.EncodeToString(sum[:])
}

// begin registers a request for key, or returns the one in flight.
func (s *Source) begin(key string) (p, busy *pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.inFlight[key]; q != nil {
		return nil, q
	}
	p = &pending{src: s, key: key, answer: make(chan Response, 1), done: make(chan struct{}), deadline: time.Now().Add(s.cfg.Timeout),
		replayCookies: s.cfg.ReplaySetCookie}
	s.inFlight[key] = p
	return p, nil
}

// settle gives p its answer unless it has one, removes it from the
// requests in flight and wakes its waiters.
func (p *pending) settle(a Response) {
	if !p.settled.CompareAndSwap(false, true) {
		return
	}
	s := p.src
	s.mu.Lock()
	if s.inFlight[p.key] == p {
		delete(s.inFlight, p.key)
	}
	s.mu.Unlock()
	p.answer <- a // buffered 1: never blocks; after the removal, so that the client's next request is not in progress
	close(p.done)
}

func (s *Source) serve(w http.ResponseWriter, r *http.Request, p *pending, key string, fp, body []byte) {
	headers := make(map[string]string, len(r.Header))
	for k, v := range r.Header {
		if len(v) > 0 {
			headers[k] = v[0]
		}
	}
	msg := consumer.Deliver(&consumer.Message{
		ID:           "http-" + strconv.FormatUint(s.seq.Add(1), 10),
		Key:          key,
		Body:         body,
		Fingerprint:  fp,
		Headers:      headers,
		PartitionKey: key, // copies of a key share a lane: the later one is a duplicate
		Topic:        r.Method + " " + r.URL.Path,
		Attempt:      1,
		ReceivedAt:   time.Now(),
		Raw:          r,
		Broker:       consumer.BrokerInfo{System: "http"},
	}, consumer.Delivery{Handle: p})
	if refused := s.enqueue(msg); refused != "" {
		p.settle(unavailable(refused))
		write(w, <-p.answer)
		return
	}
	timer := time.AfterFunc(time.Until(p.deadline), func() {
		p.settle(problemResponse(http.StatusServiceUnavailable, "the request was not settled in time; retry with the same "+HeaderKey))
	})
	select {
	case a := <-p.answer:
		timer.Stop()
		write(w, a)
	case <-r.Context().Done():
		// The client left. The request stays in progress, so that a
		// retry with its key gets 409, until the runner settles it or
		// its Timeout passes; a retry after that gets its outcome.
	}
}

// write writes res to w.
func write(w http.ResponseWriter, res Response) {
	h := w.Header()
	for k, v := range res.Header {
		h[k] = v
	}
	h.Set("Content-Length", strconv.Itoa(len(res.Body)))
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

// enqueue hands msg to the runner, or returns why it refuses it: the
// source is closed, or its queue is full.
func (s *Source) enqueue(msg *consumer.Message) (refused string) {
	s.qmu.RLock()
	defer s.qmu.RUnlock()
	if s.isClosed {
		return "the server is shutting down"
	}
	select {
	case s.queue <- msg:
		return ""
	default:
		return "too many requests are waiting"
	}
}

// Receive implements consumer.Source: it returns the requests waiting, up
// to max, blocking until there is one.
func (s *Source) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	var out []*consumer.Message
	select {
	case m := <-s.queue:
		out = append(out, m)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.closed:
		return nil, consumer.ErrClosed
	}
	for len(out) < max {
		select {
		case m := <-s.queue:
			out = append(out, m)
		default:
			return out, nil
		}
	}
	return out, nil
}

// Ack implements consumer.Source: each request is answered with its stored
// result (consumer.StoredResult), marked Idempotent-Replayed: true on a
// replay, or 204 when its handler returned none. The Set-Cookie headers
// held back from the store go to the request whose handler returned them,
// never to a replay.
func (s *Source) Ack(ctx context.Context, msgs []*consumer.Message) error {
	for _, m := range msgs {
		p := pendingOf(m)
		if p == nil {
			continue
		}
		result, replayed, _ := consumer.StoredResult(m)
		res := Response{Status: http.StatusNoContent, Header: http.Header{}}
		if result != nil {
			var err error
			if res, err = decodeResponse(result); err != nil {
				s.cfg.Logger.ErrorContext(ctx, "stored response unreadable", "key", m.Key, "err", err)
				res = problemResponse(http.StatusInternalServerError, "the stored response cannot be read")
			} else if !replayed && len(p.cookies) > 0 {
				res.Header["Set-Cookie"] = p.cookies
			}
		}
		if replayed {
			res.Header.Set(HeaderReplayed, "true")
		}
		p.settle(res)
	}
	return nil
}

// Retry implements consumer.Source: the handler failed and nothing was
// stored, so the request is answered 500 at once, with Retry-After: delay,
// and the client's retry with the same key runs the handler again (the
// runner's RetryPolicy.MaxAttempts still counts the failures per key).
func (s *Source) Retry(_ context.Context, msg *consumer.Message, delay time.Duration) error {
	if p := pendingOf(msg); p != nil {
		p.settle(withRetryAfter(problemResponse(http.StatusInternalServerError,
			"the request failed and nothing was stored; a retry with the same "+HeaderKey+" runs it again"), delay))
	}
	return nil
}

// Release implements consumer.Releaser: the request was not at fault. It is
// answered 409 when another instance handles its key (consumer.ErrKeyBusy,
// lease path) unless Config.WaitInProgress; otherwise it is delivered again
// after delay if its Timeout allows, else answered 503 with Retry-After.
func (s *Source) Release(_ context.Context, msg *consumer.Message, delay time.Duration, reason error) error {
	p := pendingOf(msg)
	switch {
	case p == nil:
		return nil
	case errors.Is(reason, consumer.ErrKeyBusy) && !s.cfg.WaitInProgress:
		p.settle(problemResponse(http.StatusConflict, busyDetail))
		return nil
	case time.Now().Add(delay).After(p.deadline):
		p.settle(withRetryAfter(problemResponse(http.StatusServiceUnavailable,
			"the request could not be completed now; retry with the same "+HeaderKey), delay))
		return nil
	}
	next := *msg
	next.Redelivered = true
	time.AfterFunc(delay, func() {
		if p.settled.Load() {
			return // out of time meanwhile
		}
		if refused := s.enqueue(&next); refused != "" {
			p.settle(unavailable(refused))
		}
	})
	return nil
}

// DeadLetter implements consumer.Source: the request is answered with the
// status its reason maps to (docs/http.md), and nothing was stored. A
// Response the store could not keep (consumer.ErrResultTooLarge,
// consumer.ErrResultUnsupported) fails the request on the transactional
// path; on the lease path its effect happened and its key is done, so the
// request is answered with the Response itself, and a retry gets 204.
func (s *Source) DeadLetter(ctx context.Context, msg *consumer.Message, reason error) error {
	p := pendingOf(msg)
	if p == nil {
		return nil
	}
	if errors.Is(reason, consumer.ErrResultTooLarge) || errors.Is(reason, consumer.ErrResultUnsupported) {
		s.unkept(ctx, msg, p, reason)
		return nil
	}
	status, detail := statusOf(reason)
	res := problemResponse(status, detail)
	if status >= 500 {
		s.cfg.Logger.ErrorContext(ctx, "request failed", "key", msg.Key, "status", status, "err", reason)
		res = withRetryAfter(res, time.Second) // nothing was stored: a retry runs the handler again
	}
	p.settle(res)
	return nil
}

// unkept answers p, whose handler's Response the store could not keep
// (reason).
func (s *Source) unkept(ctx context.Context, msg *consumer.Message, p *pending, reason error) {
	s.cfg.Logger.ErrorContext(ctx, "response not stored", "key", msg.Key, "err", reason)
	if p.tx {
		p.settle(problemResponse(http.StatusInternalServerError,
			"the response is larger than the server can store, so nothing was done"))
		return
	}
	// On the lease path the effect happened and the key is done: the
	// request gets its own Response, which no retry will see.
	if res, err := decodeResponse(p.leased); p.leased != nil && err == nil {
		if len(p.cookies) > 0 {
			res.Header["Set-Cookie"] = p.cookies
		}
		p.settle(res)
		return
	}
	p.settle(problemResponse(http.StatusInternalServerError,
		"the response could not be stored; the operation may have completed: a retry with the same "+HeaderKey+" tells"))
}

// statusOf maps a dead-letter reason to a status and a problem detail.
func statusOf(reason error) (int, string) {
	var rej *RejectError
	switch {
	case errors.As(reason, &rej):
		return rej.Status, rej.Detail
	case errors.Is(reason, consumer.ErrPayloadMismatch):
		return http.StatusUnprocessableEntity, "this " + HeaderKey + " was used with a different request payload"
	case errors.Is(reason, consumer.ErrMalformed):
		return http.StatusBadRequest, malformedDetail(reason)
	case errors.Is(reason, consumer.ErrMissingKey), errors.Is(reason, consumer.ErrInvalidKey):
		return http.StatusBadRequest, "the " + HeaderKey + " is missing or invalid"
	case errors.Is(reason, consumer.ErrOversized):
		return http.StatusRequestEntityTooLarge, "the request body is too large"
	}
	return http.StatusInternalServerError, "the request failed and nothing was stored; a retry with the same " + HeaderKey + " runs it again"
}

// malformedDetail says what is wrong with a body that did not decode, in
// the client's terms: a JSON field and kind or a position, never a Go type
// or the runner's error text.
func malformedDetail(reason error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(reason, &typeErr) && typeErr.Field != "":
		return fmt.Sprintf("the field %q of the request body cannot be a JSON %s", typeErr.Field, typeErr.Value)
	case errors.As(reason, &typeErr):
		return fmt.Sprintf("the request body cannot be a JSON %s", typeErr.Value)
	case errors.As(reason, &syntaxErr):
		return fmt.Sprintf("the request body is not valid JSON (at byte %d)", syntaxErr.Offset)
	}
	return "the request body cannot be decoded"
}

// String names the source for logs (the Runner's start line): "http
// Idempotency-Key requests". The route it is mounted on is the caller's.
func (s *Source) String() string { return "http Idempotency-Key requests" }

// Close implements consumer.Source: Receive fails with consumer.ErrClosed,
// requests not received yet are answered 503, and so is every request
// that arrives after it, at once.
func (s *Source) Close() error {
	s.once.Do(func() {
		s.qmu.Lock()
		s.isClosed = true
		close(s.closed)
		s.qmu.Unlock()
		for {
			select {
			case m := <-s.queue:
				if p := pendingOf(m); p != nil {
					p.settle(unavailable("the server is shutting down"))
				}
			default:
				return
			}
		}
	})
	return nil
}

// problemResponse is an application/problem+json (RFC 9457) response.
func problemResponse(status int, detail string) Response {
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
	}{"about:blank", http.StatusText(status), status, detail})
	return Response{Status: status, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: append(b, '\n')}
}

// withRetryAfter adds Retry-After: d, in whole seconds, at least 1, to res.
func withRetryAfter(res Response, d time.Duration) Response {
	res.Header.Set("Retry-After", strconv.Itoa(max(1, int(d.Round(time.Second)/time.Second))))
	return res
}

func problem(w http.ResponseWriter, status int, detail string) {
	write(w, problemResponse(status, detail))
}

// unavailable is a 503 response with Retry-After: 1.
func unavailable(detail string) Response {
	return withRetryAfter(problemResponse(http.StatusServiceUnavailable, detail), time.Second)
}

// pendingOf returns the request msg was made from, or nil for a message of
// another source.
func pendingOf(msg *consumer.Message) *pending {
	p, _ := consumer.DeliveryOf(msg).Handle.(*pending)
	return p
}
