package amqpsource

import (
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/internal/redact"
)

// Header names this package reads and writes.
const (
	// DefaultKeyHeader is the header read for the deduplication key when
	// Config.KeyHeader is empty.
	DefaultKeyHeader = "idempotency-key"
	// HeaderRetries counts the trips a message made through the retry
	// queues. The source sets it on every retry copy; Message.Attempt is
	// one more than it (plus the broker's x-delivery-count).
	HeaderRetries = "idemq-retries"
	// HeaderReason holds the dead-letter reason (the error text) on a
	// dead-lettered copy.
	HeaderReason = consumer.MetaReason
	// HeaderAttempts holds the number of attempts on a dead-lettered copy.
	HeaderAttempts = consumer.MetaAttempts
	// HeaderQueue holds the queue a dead-lettered copy was consumed from.
	HeaderQueue = "idemq-queue"
	// HeaderKey holds the deduplication key of a dead-lettered copy, when
	// it has one.
	HeaderKey = consumer.MetaKey
	// HeaderDeadLetteredAt holds when the copy was dead-lettered (RFC 3339).
	HeaderDeadLetteredAt = consumer.MetaDeadLetteredAt

	// headerDeliveryCount is set by quorum queues on redeliveries.
	headerDeliveryCount = "x-delivery-count"
)

// Queue types for Topology.QueueType.
const (
	QueueTypeClassic = "classic"
	QueueTypeQuorum  = "quorum"
)

// Config configures a Source. URL and Queue are required; every other zero
// field is replaced by its default in WithDefaults.
type Config struct {
	// URL is the AMQP URI of the broker, for example
	// "amqp://guest:guest@127.0.0.1:5672/". Required.
	URL string

	// Queue is the queue consumed from. It must exist unless Declare is
	// set. Required.
	Queue string

	// AMQP is passed to amqp091.DialConfig for every connection (TLS, SASL,
	// vhost, heartbeat, client properties). Its Recovery field must be nil:
	// the Source reconnects by itself (see the package documentation). Its
	// Dial defaults to a TCP dialer bounded by DialTimeout that Close
	// interrupts; its Heartbeat defaults to 10 s.
	AMQP amqp.Config

	// DialTimeout bounds establishing one connection (TCP and AMQP
	// handshake). Defaults to 10 s.
	DialTimeout time.Duration

	// Prefetch is the channel's QoS prefetch count: how many deliveries the
	// broker hands this source before they are acknowledged. Size it from
	// the runner with PrefetchFor(runnerConfig). Defaults to
	// PrefetchFor(consumer.Config{}), that is 8.
	Prefetch int

	// AckHold is how long an acknowledgement may wait for a multiple-ack.
	// Concurrent lanes settle interleaved delivery tags, and a multiple-ack
	// covers only the settled run at the head of the channel: a delivery
	// settled behind one still being handled waits for it, up to AckHold,
	// so that one frame acknowledges both; past AckHold, or while more than
	// half of Prefetch would wait, the waiting deliveries are acknowledged
	// one frame each, so that a slow delivery ahead never keeps more than
	// half of the prefetch slots. RabbitMQ's queue handles acknowledgements
	// frame by frame, and fewer frames leave it more time to deliver
	// (docs/performance.md has the measurements). Waiting happens only
	// after the commit and only widens the redelivery window of a crash,
	// which the deduplication record absorbs; Close sends every waiting
	// acknowledgement, and so does the acknowledgement of an original by
	// Retry or DeadLetter, whose copy is out already. Defaults to
	// DefaultAckHold (20 ms); negative sends each acknowledgement in the
	// loop's next pass; at most MaxAckHold.
	AckHold time.Duration

	// KeyHeader is the message header holding the deduplication key. When
	// a message lacks it, the message-id property is the key. Defaults to
	// DefaultKeyHeader ("idempotency-key").
	KeyHeader string

	// BodyHashKey, when true, makes the SHA-256 of the body the key of a
	// message that has neither KeyHeader nor a message-id. This is weaker
	// than a producer-assigned key: two different messages with the same
	// body are treated as one (the second is acknowledged without running
	// the handler), and a producer that resends with a changed body (a new
	// timestamp) is not deduplicated. Defaults to false: such messages are
	// dead-lettered with ErrMissingKey.
	BodyHashKey bool

	// PartitionKeyHeader names the header whose value becomes
	// Message.PartitionKey. The Runner handles messages with one partition
	// key in one lane, in delivery order: use it, for example, with the id
	// of the row a message updates, so that concurrent batches never lock
	// the same rows in crossing orders (deadlocks). RabbitMQ keeps the
	// queue's order for one consumer; retries, redeliveries and competing
	// consumers reorder. Defaults to "": no partition key.
	PartitionKeyHeader string

	// ConsumerTag names the consumer on the broker. Defaults to a unique tag
	// generated by the client library.
	ConsumerTag string

	// RetryQueuePrefix starts the names of the delay queues used by Retry:
	// a retry waits in "<prefix><delay>" (for example
	// "orders.retry.500ms"), a durable queue whose message TTL is that delay
	// and whose dead-letter route leads back to Queue. The queues are
	// declared on first use. Defaults to Queue + ".retry.".
	RetryQueuePrefix string

	// RetryQueueArgs are extra arguments for the retry queues, merged over
	// the defaults (see RetryQueueDefaults), for example
	// {"x-max-length": 100000}. Unless ClassicRetryQueues is set, they must
	// not weaken the at-least-once trip back to Queue: New rejects an
	// "x-queue-type" other than "quorum", an "x-dead-letter-strategy" other
	// than "at-least-once", an "x-overflow" other than "reject-publish", and
	// any "x-expires" (a quorum retry queue keeps an expired copy until Queue
	// confirms it, which can take longer than any expiry while Queue is
	// unavailable, and the broker deletes an expiring queue with what it
	// holds). With ClassicRetryQueues, "x-expires" (milliseconds, an
	// integer) is allowed: the source then declares a retry queue again
	// while it puts copies in it, so that the queue outlives them, and
	// refuses a retry delay not shorter than x-expires (the message is handed
	// back, as after a failed copy).
	// Defaults to none.
	RetryQueueArgs amqp.Table

	// ClassicRetryQueues opts out of at-least-once retry queues: the retry
	// queues are classic queues, which dead-letter an expired copy at most
	// once. A retried message is then LOST, without an error anywhere, when
	// the broker stops or crashes while its copy expires, or when Queue
	// refuses the copy or no longer exists (see the package documentation).
	// Set it only for a broker without quorum queues or at-least-once dead-lettering
	// (RabbitMQ before 3.10, or another AMQP 0.9.1 broker), where New fails
	// otherwise, or where losing a retried message is acceptable. Classic
	// queues cost less memory and disk per queue. Defaults to false.
	ClassicRetryQueues bool

	// DeadLetterExchange is the exchange DeadLetter publishes to, with
	// routing key DeadLetterRoutingKey. Defaults to "" (the default
	// exchange, which routes to the queue named by the routing key).
	DeadLetterExchange string

	// DeadLetterRoutingKey is the routing key of dead-lettered copies.
	// Defaults to Queue + ".dlq" (with the default exchange: the queue of
	// that name).
	DeadLetterRoutingKey string

	// UnroutableDelay is how long a message waits in a retry queue when the
	// dead-letter destination does not exist (the broker returned the copy
	// as unroutable, or the exchange is missing), before it is tried again.
	// The message is neither lost nor spun in a hot loop while the
	// destination is missing. It also caps how long a delivery whose retry or
	// dead-letter copy could not be published is held, keeping a prefetch
	// slot, before it is handed back to its queue (see Source.Retry): keep it
	// well below the broker's consumer_timeout (30 min by default), which
	// closes the channel of a delivery held longer. Defaults to 1 min.
	UnroutableDelay time.Duration

	// PublishTimeout bounds waiting for the broker's confirm of a retry or
	// dead-letter copy when the caller's context has no earlier deadline.
	// Defaults to 30 s.
	PublishTimeout time.Duration

	// ReconnectDelay is the delay before the first reconnect attempt after
	// the connection or channel dropped; it doubles on each failed attempt
	// up to MaxReconnectDelay, with ±20 % jitter. Defaults to 200 ms.
	ReconnectDelay time.Duration

	// MaxReconnectDelay caps the reconnect delay, and so bounds how long
	// the Source takes to reconnect once the broker answers again, however
	// long it was away. Defaults to 500 ms (one connection attempt every
	// half second costs a broker that is down nothing), or ReconnectDelay
	// if that is longer; after a few attempts, failed reconnects are logged
	// once a minute.
	MaxReconnectDelay time.Duration

	// Declare, when set, declares the topology (queue, dead-letter
	// destination, optional exchange and bindings) on every connect. It is
	// meant for quick starts and tests; production topology is usually
	// declared by operations. Defaults to nil: nothing is declared except
	// the retry queues.
	Declare *Topology

	// Logger receives the source's logs (reconnects, stale acknowledgements,
	// unroutable copies). Defaults to a logger that discards everything.
	Logger *slog.Logger
}

// Topology is what Config.Declare declares. Declarations are idempotent; one
// that conflicts with an existing entity (a queue with other arguments) makes
// New fail with the broker's error.
type Topology struct {
	// QueueType is the x-queue-type of Queue and of the dead-letter queue:
	// QueueTypeQuorum or QueueTypeClassic. Quorum queues replicate, count
	// redeliveries (x-delivery-count) and enforce DeliveryLimit. Defaults to
	// QueueTypeQuorum.
	QueueType string

	// DeliveryLimit is the quorum queue's x-delivery-limit: a message
	// returned to the queue unsettled more often than this (the consumer
	// crashed, stopped or lost its connection while holding it, each time)
	// is dead-lettered by the broker to the dead-letter destination, with
	// "delivery_limit" in its x-first-death-reason header (DeadLetterReason
	// reads it) and none of the Header* headers idemq sets.
	//
	// Handler failures do not count here: a failed attempt is retried
	// through a retry queue as a new copy, whose delivery count starts at
	// 0, and the Runner dead-letters it after consumer.RetryPolicy
	// MaxAttempts handler failures. Only unsettled returns count: crashes,
	// restarts, dropped connections, and hand-backs after a failed retry
	// copy. The limit is the only guard against a message that kills the
	// process before its handler can fail (the Runner never sees an error
	// for it), so it should exist, but sit far above what restarts and
	// deploys do to an innocent message held in the prefetch window.
	// Ignored for classic queues. Defaults to DefaultDeliveryLimit (100);
	// negative sets no x-delivery-limit argument, so the broker's default
	// applies (no limit before RabbitMQ 4.0, 20 since).
	DeliveryLimit int

	// Exchange, when not empty, is declared and Queue is bound to it with
	// each of BindingKeys. Defaults to "" (publishers use the default
	// exchange and the queue's name).
	Exchange string

	// ExchangeKind is the kind of Exchange: "direct", "topic", "fanout" or
	// "headers". Defaults to "direct".
	ExchangeKind string

	// BindingKeys are the routing keys binding Queue to Exchange. Defaults
	// to Queue's name.
	BindingKeys []string

	// QueueArgs are extra arguments for Queue (x-max-length, ...). The
	// source sets x-queue-type, x-delivery-limit and the dead-letter
	// arguments itself, and for a quorum queue "x-dead-letter-strategy":
	// "at-least-once" with "x-overflow": "reject-publish" unless QueueArgs
	// sets either: messages the broker dead-letters (over DeliveryLimit,
	// expired by an x-message-ttl) then stay in Queue until the dead-letter
	// queue has confirmed them. Defaults to none.
	QueueArgs amqp.Table
}

// Default values used by Config.WithDefaults.
const (
	DefaultDialTimeout       = 10 * time.Second
	DefaultHeartbeat         = 10 * time.Second
	DefaultUnroutableDelay   = time.Minute
	DefaultPublishTimeout    = 30 * time.Second
	DefaultReconnectDelay    = 200 * time.Millisecond
	DefaultMaxReconnectDelay = 500 * time.Millisecond
	// DefaultAckHold is Config.AckHold's default: a few batch commits of a
	// Runner at BatchSize 100 on a small machine.
	DefaultAckHold = 20 * time.Millisecond
	// MaxAckHold is the longest Config.AckHold New accepts.
	MaxAckHold = time.Minute
	// DefaultDeliveryLimit is Topology.DeliveryLimit's default: far above
	// consumer.RetryPolicy's MaxAttempts (5 by default), which counts
	// handler failures, so that the broker dead-letters only a message that
	// crash-loops its consumers, never before idemq would.
	DefaultDeliveryLimit = 100
)

// PrefetchFor returns the prefetch count that keeps a Runner with
// configuration rc busy: two batches per lane (one being handled, one
// waiting), that is 2 × Concurrency × BatchSize after defaults. A smaller
// prefetch leaves lanes idle; a much larger one only holds messages that
// other consumers of the queue could be handling.
func PrefetchFor(rc consumer.Config) int {
	rc = rc.WithDefaults()
	return 2 * max(rc.Concurrency, 1) * max(rc.BatchSize, 1)
}

// WithDefaults returns a copy of c with every zero field set to its default.
// It does not modify c.AMQP's maps.
func (c Config) WithDefaults() Config {
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.AMQP.Heartbeat == 0 {
		c.AMQP.Heartbeat = DefaultHeartbeat
	}
	if c.AMQP.Properties == nil {
		p := amqp.NewConnectionProperties()
		p.SetClientConnectionName("idemq amqpsource " + c.Queue)
		c.AMQP.Properties = p
	}
	if c.Prefetch == 0 {
		c.Prefetch = PrefetchFor(consumer.Config{})
	}
	if c.AckHold == 0 {
		c.AckHold = DefaultAckHold
	}
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	if c.RetryQueuePrefix == "" {
		c.RetryQueuePrefix = c.Queue + ".retry."
	}
	if c.DeadLetterRoutingKey == "" {
		c.DeadLetterRoutingKey = c.Queue + ".dlq"
	}
	if c.UnroutableDelay == 0 {
		c.UnroutableDelay = DefaultUnroutableDelay
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.ReconnectDelay == 0 {
		c.ReconnectDelay = DefaultReconnectDelay
	}
	if c.MaxReconnectDelay == 0 {
		c.MaxReconnectDelay = max(DefaultMaxReconnectDelay, c.ReconnectDelay)
	}
	if c.Declare != nil {
		t := c.Declare.withDefaults(c.Queue)
		c.Declare = &t
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (t Topology) withDefaults(queue string) Topology {
	if t.QueueType == "" {
		t.QueueType = QueueTypeQuorum
	}
	if t.DeliveryLimit == 0 {
		t.DeliveryLimit = DefaultDeliveryLimit
	}
	if t.ExchangeKind == "" {
		t.ExchangeKind = amqp.ExchangeDirect
	}
	if t.Exchange != "" && len(t.BindingKeys) == 0 {
		t.BindingKeys = []string{queue}
	}
	return t
}

// validate reports every invalid field of c.
func (c Config) validate() error {
	l := cfgerr.List{Prefix: "amqpsource.Config."}
	if c.URL == "" {
		l.Add("URL", "required")
	} else if _, err := url.Parse(c.URL); err != nil {
		// url.Parse's error quotes the whole URL, password included, and
		// amqp.ParseURI's quotes it before it can be redacted.
		l.AddErr("URL", "", redact.URLError(err))
	} else if _, err := amqp.ParseURI(c.URL); err != nil {
		l.AddErr("URL", "", err)
	}
	switch {
	case c.Queue == "":
		l.Add("Queue", "required")
	case len(c.Queue) > 200:
		// Leaves room for the retry and dead-letter suffixes within
		// AMQP's 255-byte short strings.
		l.Add("Queue", "longer than 200 bytes")
	default:
		if c.RetryQueuePrefix == c.Queue {
			l.Add("RetryQueuePrefix", "must differ from Queue")
		}
		if c.DeadLetterExchange == "" && c.DeadLetterRoutingKey == c.Queue {
			l.Add("DeadLetterRoutingKey", "routes dead letters back to Queue")
		}
	}
	if c.AMQP.Recovery != nil {
		l.Add("AMQP.Recovery", "must be nil: the source reconnects by itself and must know when a channel's delivery tags die")
	}
	if c.Prefetch < 1 || c.Prefetch > 65535 {
		l.Add("Prefetch", "must be between 1 and 65535")
	}
	if c.AckHold > MaxAckHold {
		l.Add("AckHold", "longer than MaxAckHold (1 min): held deliveries keep their prefetch slots and near the broker's consumer_timeout")
	}
	if c.DialTimeout < 0 {
		l.Add("DialTimeout", "must not be negative")
	}
	if c.UnroutableDelay < 0 {
		l.Add("UnroutableDelay", "must not be negative")
	}
	if c.PublishTimeout < 0 {
		l.Add("PublishTimeout", "must not be negative")
	}
	if c.ReconnectDelay < 0 {
		l.Add("ReconnectDelay", "must not be negative")
	} else if c.MaxReconnectDelay < c.ReconnectDelay {
		l.Add("MaxReconnectDelay", "smaller than ReconnectDelay")
	}
	if !c.ClassicRetryQueues {
		defaults := RetryQueueDefaults()
		for _, k := range slices.Sorted(maps.Keys(defaults)) {
			if v, ok := c.RetryQueueArgs[k]; ok && v != defaults[k] {
				l.Addf("RetryQueueArgs", "%s %v makes the trip back to Queue at-most-once (want %v); set ClassicRetryQueues to accept losing retried messages", k, v, defaults[k])
			}
		}
	}
	if expires, ok, err := millisArg(c.RetryQueueArgs, "x-expires"); err != nil {
		l.Add("RetryQueueArgs", err.Error())
	} else if ok && expires <= 0 {
		l.Addf("RetryQueueArgs", "x-expires %v must be positive", expires)
	} else if ok && !c.ClassicRetryQueues {
		l.Add("RetryQueueArgs", "x-expires would let the broker delete a retry queue with the copies it holds until Queue confirms them "+
			"(at-least-once dead-lettering keeps an expired copy there as long as Queue is unavailable, for example across a broker restart): "+
			"delete retry queues when the consumer is retired instead, or set ClassicRetryQueues to accept losing retried messages")
	}
	if t := c.Declare; t != nil {
		if t.QueueType != QueueTypeQuorum && t.QueueType != QueueTypeClassic {
			l.Addf("Declare.QueueType", "%q is neither %q nor %q", t.QueueType, QueueTypeQuorum, QueueTypeClassic)
		}
		if t.Exchange == "" && len(t.BindingKeys) > 0 {
			l.Add("Declare.BindingKeys", "set without Declare.Exchange")
		}
	}
	return l.Err()
}
