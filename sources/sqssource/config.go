package sqssource

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/idemq/idemq/internal/cfgerr"
)

// SQS limits that bound the configuration.
const (
	// MaxBatch is the largest number of entries SQS accepts in one
	// ReceiveMessage, DeleteMessageBatch or ChangeMessageVisibilityBatch
	// call.
	MaxBatch = 10
	// MaxWaitTime is the longest long-polling wait SQS accepts.
	MaxWaitTime = 20 * time.Second
	// MaxVisibility is the longest visibility timeout SQS accepts, and the
	// longest a message may stay invisible counting from its receipt.
	MaxVisibility = 12 * time.Hour
)

// Config configures a Source. QueueURL is required; every other field has a
// usable zero value that WithDefaults fills in.
type Config struct {
	// QueueURL is the URL of the queue to consume, as returned by
	// GetQueueUrl or CreateQueue. Required.
	QueueURL string

	// DeadLetterQueueURL is the queue that DeadLetter sends poison messages
	// to, with the reason in message attributes, before it deletes the
	// original. It must be a FIFO queue if and only if QueueURL is one, and
	// its RedriveAllowPolicy must allow QueueURL as a source. When it is
	// empty, dead-lettering is left to the queue's redrive policy (see
	// DeadLetter), and New fails with ErrNoDeadLetterRoute when the queue
	// has none. Defaults to empty (redrive policy).
	DeadLetterQueueURL string

	// KeyAttribute names a string message attribute that carries the
	// message's deduplication key (for example "Idempotency-Key"), set by
	// producers that may send one logical message more than once; the
	// package documentation says what a message without it is keyed on.
	// Defaults to empty (no attribute).
	KeyAttribute string

	// PartitionKeyAttribute names a string message attribute whose value
	// becomes Message.PartitionKey on standard queues: the runner handles
	// the messages of one partition key one after another, so that, keyed
	// on the id of the row a message updates, concurrent batches never lock
	// the same rows in crossing orders (deadlocks). It serializes without
	// ordering. Ignored on FIFO queues, where PartitionKey is the
	// MessageGroupId. Defaults to empty (no partition key).
	PartitionKeyAttribute string

	// VisibilityTimeout is how long a received message stays hidden from
	// other receivers before the heartbeat extends it. It is sent with every
	// ReceiveMessage call, overriding the queue's setting, and must be a
	// whole number of seconds between 1 s and 12 h. Defaults to 30 s.
	VisibilityTimeout time.Duration

	// WaitTime is the long-polling wait of ReceiveMessage, a whole number
	// of seconds up to 20 s. Defaults to 20 s.
	WaitTime time.Duration

	// MaxReceivers bounds the ReceiveMessage calls that one Receive makes in
	// parallel when it is asked for more than 10 messages (one call per 10).
	// Every call long-polls for up to WaitTime, so a busy queue fills the
	// batch in one round trip, and a quiet one costs up to MaxReceivers
	// requests per WaitTime. Defaults to 4.
	MaxReceivers int

	// RelaxedFIFOOrder lets Receive hand out several messages of one
	// MessageGroupId before the first of them is settled, so that the runner
	// may handle them in one transaction: more throughput per group, but a
	// message that fails and is retried is overtaken by the later messages
	// of its group that were already received. Ignored on standard queues.
	// Defaults to false (strict order; see the package documentation).
	RelaxedFIFOOrder bool

	// HeartbeatInterval is how often the visibility of in-flight messages
	// (received and not yet settled) is extended: every tick, each one whose
	// visibility timeout started at least half an interval ago is made
	// invisible for another VisibilityTimeout, 10 per
	// ChangeMessageVisibilityBatch call. It must be at most half of
	// VisibilityTimeout. A negative value disables the heartbeat: a message
	// still in flight when its visibility timeout passes is delivered again
	// while the first delivery is still being handled (the transactional
	// path still applies its effect once). Defaults to VisibilityTimeout / 3.
	HeartbeatInterval time.Duration

	// MaxExtension is the hard limit of the heartbeat: a message is never
	// kept invisible for longer than this since it was received, so a stuck
	// handler cannot hide a message for ever. Past it, the message becomes
	// visible again when its current visibility timeout ends. At most 12 h
	// (the SQS limit). Defaults to 15 min.
	MaxExtension time.Duration

	// RequestTimeout bounds each SQS call made to settle or extend messages,
	// and, on top of WaitTime, each ReceiveMessage call. Defaults to 30 s.
	RequestTimeout time.Duration

	// DeleteAttempts is how many times Ack sends the entries of a
	// DeleteMessageBatch that failed for a reason other than the caller's
	// (the SDK's own retries of a failed request come on top). Defaults
	// to 3.
	DeleteAttempts int

	// RedriveDelay is how long DeadLetter keeps a message hidden before it
	// becomes visible again when dead-lettering is left to the queue's
	// redrive policy, or when writing a dead letter to DeadLetterQueueURL or
	// deleting the original failed: a poison message is then handled once
	// per RedriveDelay until SQS moves it, not back to back. Rounded up to
	// whole seconds, at most 12 h; negative means at once. Defaults to 30 s.
	RedriveDelay time.Duration

	// ReleaseTimeout bounds how long Close spends making the messages still
	// in flight visible again, so that other consumers get them at once
	// instead of after their visibility timeout. Negative disables the
	// release. Defaults to 5 s.
	ReleaseTimeout time.Duration

	// Logger receives the source's logs. Defaults to a logger that discards
	// everything.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.VisibilityTimeout = cmp.Or(c.VisibilityTimeout, 30*time.Second)
	c.WaitTime = cmp.Or(c.WaitTime, MaxWaitTime)
	c.MaxReceivers = cmp.Or(c.MaxReceivers, 4)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, c.VisibilityTimeout/3)
	c.MaxExtension = cmp.Or(c.MaxExtension, 15*time.Minute)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, 30*time.Second)
	c.DeleteAttempts = cmp.Or(c.DeleteAttempts, 3)
	c.ReleaseTimeout = cmp.Or(c.ReleaseTimeout, 5*time.Second)
	c.RedriveDelay = cmp.Or(c.RedriveDelay, 30*time.Second)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// heartbeat reports whether the heartbeat is enabled.
func (c Config) heartbeat() bool { return c.HeartbeatInterval > 0 }

// validate reports every invalid field of c.
func (c Config) validate() error {
	wholeSeconds := func(d time.Duration) bool { return d%time.Second == 0 }
	l := cfgerr.List{Prefix: "sqssource.Config."}
	if c.QueueURL == "" {
		l.Add("QueueURL", "required")
	} else if c.DeadLetterQueueURL == c.QueueURL {
		l.Add("DeadLetterQueueURL", "is the consumed queue itself")
	}
	badVisibility := c.VisibilityTimeout < time.Second || c.VisibilityTimeout > MaxVisibility || !wholeSeconds(c.VisibilityTimeout)
	if badVisibility {
		l.Addf("VisibilityTimeout", "%s is not a whole number of seconds between 1s and 12h", c.VisibilityTimeout)
	}
	if c.WaitTime < 0 || c.WaitTime > MaxWaitTime || !wholeSeconds(c.WaitTime) {
		l.Addf("WaitTime", "%s is not a whole number of seconds up to 20s", c.WaitTime)
	}
	l.Positive("MaxReceivers", c.MaxReceivers)
	if !badVisibility && c.heartbeat() && c.HeartbeatInterval > c.VisibilityTimeout/2 {
		l.Addf("HeartbeatInterval", "%s is more than half of VisibilityTimeout %s", c.HeartbeatInterval, c.VisibilityTimeout)
	}
	if c.MaxExtension <= 0 || c.MaxExtension > MaxVisibility {
		l.Addf("MaxExtension", "%s is not above 0 and at most 12h", c.MaxExtension)
	}
	l.NotNegative("RequestTimeout", c.RequestTimeout)
	l.Positive("DeleteAttempts", c.DeleteAttempts)
	if c.RedriveDelay > MaxVisibility {
		l.Addf("RedriveDelay", "%s is more than 12h", c.RedriveDelay)
	}
	return l.Err()
}
