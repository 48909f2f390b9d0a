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
type receiver struct {
	srv    *http.Server
	url    string
	prefix string // the Idempotency-Key's scope part, "<scope>:"

	mu       sync.Mutex
	requests map[string]int // per message key
	foreign  []string       // keys without the scope prefix, or none
}

// startReceiver serves on a free loopback port. Keys are expected as
// consumer.IdempotencyKey makes them for scope.
func startReceiver(scope string) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{prefix: scope + ":", requests: map[string]int{}, url: "http://" + ln.Addr().String() + "/effects"}
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
	r.mu.Lock()
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

func (r *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}
