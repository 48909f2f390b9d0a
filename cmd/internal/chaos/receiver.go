package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/sinks/webhook"
)

// receiver is the downstream of the lease-path scenario: a webhook
// receiver in the suite's process that, like a vendor's API, applies each
// Idempotency-Key once and answers a repeat of an applied key without
// applying it again. It counts every request per key, so that the suite
// sees both the effects (keys applied) and the repeats the lease window let
// through and the key closed.
//
// Before it answers, it asks done whether the lease store already holds the
// key as done: the handler of a done key must not run again, so such a
// request is a broken promise, unless a failover lost the lease (see
// scenario.verify).
type receiver struct {
	srv    *http.Server
	url    string
	prefix string // the Idempotency-Key's scope part, "<scope>:"
	done   func(ctx context.Context, key string) (bool, error)

	mu       sync.Mutex
	requests map[string]int // per message key
	foreign  []string       // keys without the scope prefix, or none
	// afterDone are the requests that arrived for a key already done.
	afterDone []arrival
	// unchecked counts the requests done could not check (the store
	// failed: a master down).
	unchecked int
}

// arrival is one request of key at a time.
type arrival struct {
	key string
	at  time.Time
}

// startReceiver serves on a free loopback port. Keys are expected as
// consumer.IdempotencyKey makes them for scope. done may be nil.
func startReceiver(scope string, done func(ctx context.Context, key string) (bool, error)) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{prefix: scope + ":", done: done, requests: map[string]int{}, url: "http://" + ln.Addr().String() + "/effects"}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := r.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.mu.Lock()
			r.foreign = append(r.foreign, "serve: "+err.Error())
			r.mu.Unlock()
		}
	}()
	return r, nil
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	_, _ = io.Copy(io.Discard, req.Body)
	key, ok := strings.CutPrefix(req.Header.Get(webhook.DefaultKeyHeader), r.prefix)
	at := time.Now()
	var isDone bool
	var doneErr error
	if ok && key != "" && r.done != nil {
		isDone, doneErr = r.done(req.Context(), key)
	}
	r.mu.Lock()
	if isDone {
		r.afterDone = append(r.afterDone, arrival{key: key, at: at})
	}
	if doneErr != nil {
		r.unchecked++
	}
	if ok && key != "" {
		r.requests[key]++
	} else {
		r.foreign = append(r.foreign, req.Header.Get(webhook.DefaultKeyHeader))
	}
	r.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// counts returns the requests in all, the keys applied, the keys applied
// that are no item (poison), and the requests whose key was missing or
// not of the run's scope.
func (r *receiver) counts() (requests, applied, extra int, foreign []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, n := range r.requests {
		requests += n
		applied++
		if !strings.HasPrefix(k, "item-") {
			extra++
		}
	}
	return requests, applied, extra, append([]string(nil), r.foreign...)
}

// checks returns the requests that arrived for a key already done, and
// the number of requests that could not be checked.
func (r *receiver) checks() (afterDone []arrival, unchecked int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]arrival(nil), r.afterDone...), r.unchecked
}

func (r *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}

// quietRedis drops go-redis's own log lines: while the fault phase kills a
// master, the receiver's client logs every failed dial, and the suite
// reports what the store could not answer itself (unchecked requests).
type quietRedis struct{}

// Printf implements go-redis's logger.
func (quietRedis) Printf(context.Context, string, ...any) {}
