package amqpsource

import (
	"errors"
	"fmt"

	"github.com/idemq/idemq/consumer"
)

var (
	// ErrStaleDelivery reports a settlement (Ack, Retry, DeadLetter) of a
	// message whose channel has died since it was received. Its delivery tag
	// is meaningless on any other channel, so nothing is sent: the broker has
	// already put the message back in the queue and redelivers it with
	// Redelivered set, and the runner's deduplication absorbs the
	// redelivery. It is harmless.
	ErrStaleDelivery = errors.New("amqpsource: delivery belongs to a closed channel; the broker redelivers it")

	// ErrUnroutable reports a retry or dead-letter copy that the broker
	// returned because no queue is bound to its destination. The original
	// is not acknowledged.
	ErrUnroutable = errors.New("amqpsource: copy returned as unroutable")

	// ErrNotConfirmed reports a retry or dead-letter copy that the broker
	// did not confirm (a negative confirm, or no confirm before the
	// deadline). The original is not acknowledged.
	ErrNotConfirmed = errors.New("amqpsource: copy not confirmed by the broker")

	// ErrForeignMessage reports a consumer.Message that this Source did not
	// produce.
	ErrForeignMessage = errors.New("amqpsource: message was not received from this source")
)

// MissingKeyError reports a message that carries neither the key header nor
// a message-id property (and Config.BodyHashKey is off). It matches
// consumer.ErrMissingKey, so the runner dead-letters the message without
// retrying it. Source.Key returns it.
type MissingKeyError struct {
	Queue     string
	KeyHeader string
}

// Error implements error.
func (e *MissingKeyError) Error() string {
	return fmt.Sprintf("amqpsource: message from queue %q has neither a %q header nor a message-id property", e.Queue, e.KeyHeader)
}

// Is makes errors.Is(err, consumer.ErrMissingKey) true.
func (e *MissingKeyError) Is(target error) bool { return target == consumer.ErrMissingKey }
