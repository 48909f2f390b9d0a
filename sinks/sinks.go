package sinks

import (
	"context"
	"errors"

	"github.com/idemq/idemq/consumer"
)

// ErrNoKey reports a send without an idempotency key: the context carries no
// consumer.IdempotencyKey (the sink runs outside a Runner) and the request names
// none. It is wrapped with consumer.Permanent, since no retry can fix it.
var ErrNoKey = errors.New("sinks: no idempotency key (not called by a Runner, and the request sets none)")

// Key returns the idempotency key of the effect being sent: explicit if it is
// not empty, else consumer.IdempotencyKey(ctx) (the consumer's name and the
// message's deduplication key). Without either it returns an error
// matching ErrNoKey, wrapped with consumer.Permanent.
//
// An explicit key must be as stable as IdempotencyKey: the same on every attempt
// and every redelivery of one message. Never derive it from a lease token,
// a time or a random number.
func Key(ctx context.Context, explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if k, ok := consumer.IdempotencyKey(ctx); ok && k != "" {
		return k, nil
	}
	return "", consumer.Permanent(ErrNoKey)
}
