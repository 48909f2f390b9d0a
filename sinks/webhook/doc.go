// Package webhook is an HTTP webhook sink for idemq's lease path. Every
// attempt of a message sends the same stable idempotency key,
// consumer.IdempotencyKey(ctx), in an Idempotency-Key header, so that the receiver
// can recognise a repeated delivery. When the handler's context carries a
// span (consumer/otelidemq), the request carries it too, as a W3C
// traceparent header by default (Config.Propagator; otelidemq.Propagator()
// follows the application's global propagator), so the receiver's spans
// join the message's trace.
//
//	sink, err := webhook.New(webhook.Config{URL: "https://hooks.example.com/notify"})
//	...
//	path := consumer.Leased(store, sink.Handler(), consumer.LeaseOptions{})
//
// # Outcomes
//
// Send performs one attempt and lets the Runner retry:
//
//	2xx                        done: the key is marked done and the message acknowledged
//	408 409 425 429 5xx        retried: after Retry-After if the answer has one
//	                           (capped at Config.MaxRetryAfter), else with the
//	                           runner's backoff; dead-lettered after
//	                           RetryPolicy.MaxAttempts
//	timeouts, network errors   retried with the runner's backoff
//	other 4xx, 3xx             permanent: dead-lettered at once
//	unsendable request         permanent (ErrInvalidHeader: a key or header
//	                           with CR, LF or another control character;
//	                           sinks.ErrNoKey: no idempotency key)
//
// 409 Conflict is retried because receivers that implement idempotency keys
// answer it while a request with the same key is still being processed.
// An error for an answer carries a *StatusError (errors.As finds it).
//
// # Remaining duplicate window
//
// A crash after the receiver accepted the webhook and before the lease store
// marked the key done sends the webhook again once the lease expires, and an
// attempt that timed out on this side may have been accepted on the other.
// Both repeats carry the same Idempotency-Key: a receiver that deduplicates
// by it applies the effect once; one that ignores it applies it twice. The
// sink never retries with a new key.
//
// # Secrets in the URL
//
// Errors, logs and dead-letter reasons show the endpoint redacted: its
// scheme, user name, host and port, with the password, path, query and
// fragment masked, since these may carry a token. StatusError.URL is that
// redacted form.
package webhook
