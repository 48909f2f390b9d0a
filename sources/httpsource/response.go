package httpsource

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"

	"github.com/idemq/idemq/consumer"
)

// Response is what an endpoint answers: the status, the headers and the
// body. The runner stores it with the request's record, so a retried
// request with the same key gets it back byte for byte (with
// Idempotent-Replayed: true), for the record's retention.
//
// A Response with a 4xx or 5xx status is stored and replayed like any
// other: it is the endpoint's answer, decided after it started executing
// (Stripe's practice). To refuse a request without storing anything, so
// that the client's retry runs again, return Reject's error instead.
type Response struct {
	// Status is the HTTP status code of the final response: 200 to 999
	// (a 1xx fails the request, and nothing is stored). Defaults to 200.
	Status int
	// Header holds the response headers. Hop-by-hop headers (Connection,
	// the headers it names, Keep-Alive, Transfer-Encoding, Upgrade, TE,
	// Trailer, Proxy-*) are dropped: net/http writes those of its own
	// connection. Content-Length is computed, and may not be set.
	// Set-Cookie is sent but not stored unless Config.ReplaySetCookie.
	Header http.Header
	// Body is the response body.
	Body []byte
}

// JSON returns a Response with status and v encoded as JSON, with
// Content-Type application/json.
func JSON(status int, v any) (Response, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return Response{}, consumer.Permanent(fmt.Errorf("httpsource: encoding %T: %w", v, err))
	}
	return Response{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: append(b, '\n')}, nil
}

// Tx adapts an endpoint of the transactional path: h runs inside the
// runner's transaction, and the Response it returns is stored with the
// request's record in that transaction (consumer.TxResult), so the effect
// and the answer commit together. msg.Body is the request body,
// msg.Headers its headers (first values), and msg.Raw the *http.Request
// (its body already read; use it for the URL, PathValue, the method).
func Tx[T any](h func(ctx context.Context, tx T, msg *consumer.Message) (Response, error)) consumer.TxHandler[T] {
	return consumer.TxResult(func(ctx context.Context, tx T, msg *consumer.Message) ([]byte, error) {
		res, err := h(ctx, tx, msg)
		if err != nil {
			return nil, err
		}
		return storedResponse(msg, res, false)
	})
}

// Lease adapts an endpoint of the lease path (effects outside a database:
// a payment provider, an email): the Response h returns is stored next to
// the done key (consumer.Result). Forward consumer.IdempotencyKey(ctx)
// to the downstream system, so that the crash window between its effect
// and the done mark is covered downstream.
func Lease(h func(ctx context.Context, msg *consumer.Message) (Response, error)) consumer.Handler {
	return consumer.Result(func(ctx context.Context, msg *consumer.Message) ([]byte, error) {
		res, err := h(ctx, msg)
		if err != nil {
			return nil, err
		}
		return storedResponse(msg, res, true)
	})
}

// Respond records res as the response to msg from a
// consumer.TransactionalBatch handler, which returns no Response of its
// own: like Tx's, it is stored with the request's record in the batch's
// transaction (consumer.Message.SetResult), answered once that commits, and
// replayed to retries. Call it for each message of the batch before the
// handler returns; a request whose handler set none is answered 204 No
// Content. It fails only for an invalid status.
func Respond(msg *consumer.Message, res Response) error {
	b, err := storedResponse(msg, res, false)
	if err != nil {
		return err
	}
	msg.SetResult(b)
	return nil
}

// Request returns the *http.Request a message was made from, or nil for a
// message of another source. Its body has been read into msg.Body.
func Request(msg *consumer.Message) *http.Request {
	r, _ := msg.Raw.(*http.Request)
	return r
}

// RejectError is the error of Reject: a refusal with a 4xx status that
// stores nothing.
type RejectError struct {
	// Status is the 4xx status the request is answered with.
	Status int
	// Detail is the problem's detail member, shown to the caller.
	Detail string
}

// Error implements error.
func (e *RejectError) Error() string {
	return fmt.Sprintf("httpsource: rejected with %d %s: %s", e.Status, http.StatusText(e.Status), e.Detail)
}

// Reject returns an error for a handler to refuse a request with status (a
// 4xx code; anything else becomes 400) and detail, in an
// application/problem+json body. Nothing is stored: the transaction rolls
// back, and a retry with the same key runs the handler again. Use it for
// input the handler validates before it starts its effect (Stripe stores no
// result for requests that failed validation).
func Reject(status int, detail string) error {
	if status < 400 || status > 499 {
		status = http.StatusBadRequest
	}
	return consumer.Permanent(&RejectError{Status: status, Detail: detail})
}

// storedResponse encodes res, returned through Lease when lease, else
// through Tx or Respond, as the response to msg is stored: without its
// Set-Cookie headers unless msg's Source replays them
// (Config.ReplaySetCookie). Those held back are kept with the request, for
// its own answer alone, and so is what Lease encoded, for the answer to a
// request whose Response the store refuses.
func storedResponse(msg *consumer.Message, res Response, lease bool) ([]byte, error) {
	p := pendingOf(msg)
	keep := p != nil && p.replayCookies
	b, cookies, err := encodeResponse(res, keep)
	if p != nil {
		p.cookies, p.tx, p.leased = cookies, !lease, nil
		if lease {
			p.leased = b
		}
	}
	return b, err
}

// respMagic starts a stored Response, so that a result stored by another
// handler (consumer.TxResult with raw bytes) is told apart.
const respMagic = "idemq-http/1 "

// encodeResponse renders res as it is stored: a status line, the headers in
// MIME format (sorted, so equal responses store equal bytes), a blank line
// and the body. Unless keepCookies, the Set-Cookie values are left out and
// returned apart.
func encodeResponse(res Response, keepCookies bool) (stored []byte, cookies []string, err error) {
	if res.Status == 0 {
		res.Status = http.StatusOK
	}
	if res.Status < 200 || res.Status > 999 {
		// 1xx: an interim response, not an answer to store.
		return nil, nil, consumer.Permanent(fmt.Errorf("httpsource: invalid status %d for a final response", res.Status))
	}
	hop := hopByHop(res.Header)
	var b bytes.Buffer
	b.WriteString(respMagic + strconv.Itoa(res.Status) + "\r\n")
	for _, k := range slices.Sorted(maps.Keys(res.Header)) {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if hop(ck) {
			continue
		}
		if !validHeaderName(ck) || ck == "Content-Length" || ck == "Idempotent-Replayed" {
			return nil, nil, consumer.Permanent(fmt.Errorf("httpsource: header %q cannot be stored", k))
		}
		for _, v := range res.Header[k] {
			if !validHeaderValue(v) {
				return nil, nil, consumer.Permanent(fmt.Errorf("httpsource: header %q has an invalid value", k))
			}
			if ck == "Set-Cookie" && !keepCookies {
				cookies = append(cookies, v)
				continue
			}
			b.WriteString(ck + ": " + v + "\r\n")
		}
	}
	b.WriteString("\r\n")
	b.Write(res.Body)
	return b.Bytes(), cookies, nil
}

// decodeResponse reads a stored Response. A result without the magic
// prefix (stored by a handler that is not Tx or Lease) is the body of a
// 200 application/octet-stream response.
func decodeResponse(stored []byte) (Response, error) {
	rest, ok := bytes.CutPrefix(stored, []byte(respMagic))
	if !ok {
		return Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: stored}, nil
	}
	statusLine, rest, ok := bytes.Cut(rest, []byte("\r\n"))
	if !ok {
		return Response{}, errors.New("httpsource: stored response has no status line")
	}
	status, err := strconv.Atoi(string(statusLine))
	if err != nil {
		return Response{}, fmt.Errorf("httpsource: stored response status %q: %w", statusLine, err)
	}
	res := Response{Status: status, Header: http.Header{}}
	for {
		var line []byte
		line, rest, ok = bytes.Cut(rest, []byte("\r\n"))
		if !ok {
			return Response{}, errors.New("httpsource: stored response headers do not end")
		}
		if len(line) == 0 {
			break
		}
		k, v, ok := bytes.Cut(line, []byte(": "))
		if !ok {
			return Response{}, fmt.Errorf("httpsource: stored response header line %q", line)
		}
		res.Header[string(k)] = append(res.Header[string(k)], string(v))
	}
	res.Body = rest
	return res, nil
}

// hopByHopHeaders are the headers of one connection (RFC 9110 section
// 7.6.1, and those net/http's reverse proxy removes): net/http writes
// its own, and a stored response never carries them.
var hopByHopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
}

// hopByHop reports whether a canonical header name is hop-by-hop in h:
// one of hopByHopHeaders or named by h's Connection header.
func hopByHop(h http.Header) func(string) bool {
	var named []string
	for _, v := range h.Values("Connection") {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				named = append(named, textproto.CanonicalMIMEHeaderKey(f))
			}
		}
	}
	return func(k string) bool { return hopByHopHeaders[k] || slices.Contains(named, k) }
}

func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return true
}

func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}
