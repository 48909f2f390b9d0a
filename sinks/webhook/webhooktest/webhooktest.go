// Package webhooktest is a webhook receiver for tests of code that uses
// sinks/webhook: an httptest server that counts requests and successful
// answers per Idempotency-Key, tracks how many requests of one key were in
// flight at once, and answers as a test scripts it.
package webhooktest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/idemq/idemq/sinks/webhook"
)

// Call is one request the receiver got.
type Call struct {
	// Request is the request; its body has been read into Body.
	Request *http.Request
	// Key is the value of the Idempotency-Key header ("" if absent).
	Key string
	// N counts the requests with this Key so far, this one included (1 for
	// the first).
	N int
	// Body is the request body.
	Body []byte
}

// Response is the receiver's answer to one Call.
type Response struct {
	// Status is the HTTP status. Zero means 200.
	Status int
	// Header holds response headers, such as Retry-After.
	Header http.Header
	// Body is the response body.
	Body string
}

// Receiver is a running webhook receiver. Its methods are safe for
// concurrent use.
type Receiver struct {
	srv     *httptest.Server
	respond func(Call) Response

	mu            sync.Mutex
	calls         map[string]int
	successes     map[string]int
	bodies        map[string][][]byte
	inFlight      map[string]int
	maxConcurrent int
}

// New starts a receiver that answers each request with respond(call), or 200
// when respond is nil. respond may block (honour call.Request.Context()) and
// is called concurrently. The receiver is closed when t ends.
func New(t testing.TB, respond func(Call) Response) *Receiver {
	t.Helper()
	r := &Receiver{
		respond:   respond,
		calls:     make(map[string]int),
		successes: make(map[string]int),
		bodies:    make(map[string][][]byte),
		inFlight:  make(map[string]int),
	}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	key := req.Header.Get(webhook.DefaultKeyHeader)

	r.mu.Lock()
	r.calls[key]++
	n := r.calls[key]
	r.inFlight[key]++
	r.maxConcurrent = max(r.maxConcurrent, r.inFlight[key])
	r.mu.Unlock()

	resp := Response{Status: http.StatusOK}
	if r.respond != nil {
		resp = r.respond(Call{Request: req, Key: key, N: n, Body: body})
		if resp.Status == 0 {
			resp.Status = http.StatusOK
		}
	}

	r.mu.Lock()
	r.inFlight[key]--
	// A success whose answer cannot reach the client (it gave up) still
	// counts: the effect happened on this side.
	if resp.Status >= 200 && resp.Status < 300 {
		r.successes[key]++
		r.bodies[key] = append(r.bodies[key], body)
	}
	r.mu.Unlock()

	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.Status)
	_, _ = io.WriteString(w, resp.Body)
}

// URL returns the receiver's base URL.
func (r *Receiver) URL() string { return r.srv.URL }

// Calls returns how many requests carried key.
func (r *Receiver) Calls(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[key]
}

// Successes returns how many requests with key were answered 2xx: how many
// times the effect happened on the receiver's side.
func (r *Receiver) Successes(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.successes[key]
}

// Bodies returns the bodies of the requests with key that were answered 2xx.
func (r *Receiver) Bodies(key string) [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.bodies[key])
}

// Keys returns every key the receiver saw, sorted.
func (r *Receiver) Keys() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.calls))
	for k := range r.calls {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TotalCalls returns the number of requests received.
func (r *Receiver) TotalCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += c
	}
	return n
}

// TotalSuccesses returns the number of requests answered 2xx.
func (r *Receiver) TotalSuccesses() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.successes {
		n += c
	}
	return n
}

// MaxConcurrent returns the largest number of requests with one key that
// were being answered at the same moment. Above 1, two attempts of one
// message ran concurrently.
func (r *Receiver) MaxConcurrent() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxConcurrent
}
