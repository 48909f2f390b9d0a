package amqpsource

import (
	"errors"
	"fmt"
)

var (
	// ErrStaleDelivery reports a settlement (Ack, Retry, DeadLetter) of a
	// message whose channel has died since it was received. Its delivery tag
	// is meaningless on any other channel, so nothing is sent: the broker has
	// already put the message back in the queue and redelivers it with
	// Redelivered set, and the runner's deduplication absorbs the
	// redelivery. It is harmless.
	ErrStaleDelivery = errors.New("amqpsource: delivery belongs to a closed channel; the broker redelivers it")

	// ErrUnroutable reports a retry or dead-letter copy whose destination
	// does not exist: the broker returned it because no queue is bound to
	// its routing key, or closed the publishing channel because its
	// exchange does not exist. DeadLetter then parks the message in a retry
	// queue (see Source.DeadLetter); otherwise the original is not
	// acknowledged and is handed back to its queue after a hold.
	ErrUnroutable = errors.New("amqpsource: copy returned as unroutable")

	// ErrNotConfirmed reports a retry or dead-letter copy that the broker
	// did not confirm (a negative confirm, no confirm before the deadline,
	// or a publishing channel that closed first: ErrPublishChannelClosed).
	// The original is not acknowledged; it is handed back to its queue after
	// a hold (see Source.Retry). A copy whose confirm only timed out may
	// still have been written, and then comes back besides the original;
	// deduplication absorbs the duplicate.
	ErrNotConfirmed = errors.New("amqpsource: copy not confirmed by the broker")

	// ErrPublishChannelClosed reports a retry or dead-letter copy whose
	// publishing channel closed before the broker confirmed it: the broker
	// refused the publish with a channel error (the error carries the
	// broker's *amqp091.Error, for example ACCESS_REFUSED), or the connection
	// dropped. It matches ErrNotConfirmed. The next copy goes out on a new
	// channel.
	ErrPublishChannelClosed = fmt.Errorf("%w: publishing channel closed", ErrNotConfirmed)

	// ErrForeignMessage reports a consumer.Message that this Source did not
	// produce.
	ErrForeignMessage = errors.New("amqpsource: message was not received from this source")
)
