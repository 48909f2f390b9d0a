package consumer

import (
	"context"
	"time"
)

// Source is a broker adapter: it receives messages and settles them. The
// Runner calls Receive from one goroutine and the settling methods (Ack,
// Retry, DeadLetter) from several, so implementations must be safe for
// concurrent use.
//
// Every method that settles a message receives Message values that this Source
// returned from Receive. The Runner settles each received message exactly once
// (Ack, Retry or DeadLetter), unless the process stops first; a message that
// is never settled must come back from the broker (at-least-once delivery).
type Source interface {
	// Receive blocks until at least one message is available, then returns
	// up to max messages. It returns ctx.Err() (possibly wrapped) when ctx is
	// done, and a non-nil error for broker failures; the Runner retries
	// those with backoff. Receive must not acknowledge anything.
	Receive(ctx context.Context, max int) ([]*Message, error)

	// Ack acknowledges messages whose effect is durable. After Ack returns
	// nil the acknowledgement has left the client (brokers without
	// confirmed acks, like AMQP, cannot promise more), or, for sources with
	// cumulative acknowledgement, is recorded and sent once every earlier
	// message of the partition is settled; a lost one means a redelivery,
	// which deduplication absorbs. A failed Ack is
	// harmless: the message is redelivered and recognised as a duplicate.
	// Sources with cumulative acknowledgement (Kafka offsets) must never
	// acknowledge a message that has not itself been passed to Ack.
	Ack(ctx context.Context, msgs []*Message) error

	// Retry hands msg back for redelivery no sooner than delay from now,
	// with Attempt increased. The message must not be lost if the process
	// stops before the delay elapses.
	Retry(ctx context.Context, msg *Message, delay time.Duration) error

	// DeadLetter moves msg to the source's dead-letter destination together
	// with reason (and the attempt count), then acknowledges it. Until the
	// dead-letter write is durable, the original must stay unacknowledged.
	DeadLetter(ctx context.Context, msg *Message, reason error) error

	// Close stops receiving and releases the connection. Messages received
	// but not acknowledged return to the broker. Close is safe to call more
	// than once and concurrently with the other methods, which then fail
	// with ErrClosed.
	Close() error
}

// Releaser is an optional interface of a Source. Release hands msg back for
// redelivery no sooner than delay from now, like Retry, but without counting
// an attempt. The runner calls it instead of Retry when the message is not at
// fault: the database or the lease store failed, another worker holds the
// message's lease, or an earlier message of its partition failed in the same
// batch or was handed back before it. reason says which (never nil): it
// matches ErrKeyBusy when another worker holds the key's lease, and is the
// store's error or the hold's otherwise; a source that answers a caller
// (httpsource) can tell a busy key from an outage by it. Sources whose
// broker counts deliveries itself (SQS's receive count) do not implement it.
type Releaser interface {
	Release(ctx context.Context, msg *Message, delay time.Duration, reason error) error
}

// PartitionLag is how far a consumer is behind one partition of a log-based
// broker (a Kafka topic partition).
type PartitionLag struct {
	// System is the broker's messaging system, as BrokerInfo.System names
	// it.
	System    string
	Topic     string
	Partition int
	// Lag is the number of messages in the partition at or after the first
	// one the consumer has not settled: fetched and not settled yet, or
	// not fetched yet. It is the partition's high watermark minus the next
	// offset the consumer will commit.
	Lag int64
}

// LagReporter is an optional interface of a Source on a log-based broker,
// implemented by kafkasource. Lag returns the lag of each partition the
// source consumes, read from the broker within ctx (one request); it is safe
// for concurrent use. otelidemq exports it as a gauge (Hook.ObserveLag).
type LagReporter interface {
	Lag(ctx context.Context) ([]PartitionLag, error)
}
