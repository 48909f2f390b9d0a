package sinks

import (
	"context"
	"errors"
	"fmt"

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

// Sender is the shape of every sink: Send performs one attempt of an effect
// described by a request of type R, with the idempotency key from Key, and
// classifies the outcome as the package documentation describes. Senders are
// safe for concurrent use.
type Sender[R any] interface {
	Send(ctx context.Context, req R) error
}

// Handler returns a consumer.Handler for consumer.Leased that builds a
// request from each message with build and sends it with s. An error from
// build is returned as it is (wrap it with consumer.Permanent, or return an
// error matching consumer.ErrMalformed, for input that can never be sent).
func Handler[R any](s Sender[R], build func(ctx context.Context, msg *consumer.Message) (R, error)) consumer.Handler {
	return func(ctx context.Context, msg *consumer.Message) error {
		req, err := build(ctx, msg)
		if err != nil {
			return fmt.Errorf("sinks: building the request: %w", err)
		}
		return s.Send(ctx, req)
	}
}
