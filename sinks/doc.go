// Package sinks holds the effect senders of idemq's lease path: effects that
// cannot join a database transaction, such as webhooks, emails, SMS and
// payment-vendor calls. Each sink lives in its own package (sinks/webhook is
// the first); this package holds what they share.
//
// sinks/outbox is the other way to reach a broker from a handler: it writes
// the message in the handler's database transaction, and its relay
// publishes it after the commit (transactional path, no lease).
//
// # The contract of a sink
//
// A sink performs one attempt of an effect per call and leaves retrying to
// the Runner, which retries with backoff, survives restarts (the broker holds
// the message) and dead-letters after RetryPolicy.MaxAttempts. A sink's Send
// is safe for concurrent use, and it:
//
//   - sends the idempotency key returned by Key, which is
//     consumer.IdempotencyKey(ctx): the same on every attempt and every redelivery
//     of the message, never a fresh one, so that the downstream system can
//     recognise a repeated effect;
//   - returns nil only when the downstream system accepted the effect (or
//     recognised the key as already done);
//   - returns an error wrapped with consumer.Permanent when no retry can
//     succeed (the message goes to the dead-letter route at once);
//   - returns an error wrapped with consumer.RetryAfter when the downstream
//     system asked for a delay, capped to a sane maximum;
//   - returns any other error for a retry with the runner's backoff: outages,
//     timeouts, throttling without a delay;
//   - honours ctx: the runner cancels it when the lease is lost or the
//     handler times out, and the sink must stop rather than send late.
//
// # Remaining duplicate window
//
// A sink cannot make the effect and the lease store's "done" mark atomic: a
// crash after the downstream system accepted the effect and before the key is
// marked done repeats the effect once the lease expires (see
// dedup/redisdedup). The repeat carries the same idempotency key, so a
// downstream system that deduplicates by key applies it once. Downstream
// systems that ignore the key see it twice; the window is then as large as
// the crash window of the lease path, and no sink can close it alone.
package sinks
