package kafkasource

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/cfgerr"
)

// Header names this package reads and writes. A dead-lettered copy carries
// consumer.MetaReason (the error text), consumer.MetaAttempts (in decimal),
// consumer.MetaKey (when the runner computed a key) and
// consumer.MetaDeadLetteredAt (RFC 3339 with nanoseconds, UTC), and the
// Kafka fields below.
const (
	// DefaultKeyHeader is the header read for the deduplication key when
	// Config.KeyHeader is empty.
	DefaultKeyHeader = "idempotency-key"
	// MetaOriginTopic holds the topic a dead-lettered copy was consumed
	// from.
	MetaOriginTopic = "idemq-origin-topic"
	// MetaOriginPartition holds the partition a dead-lettered copy was
	// consumed from, in decimal.
	MetaOriginPartition = "idemq-origin-partition"
	// MetaOriginOffset holds the offset of the original message, in
	// decimal. Topic, partition and offset together identify it; use them to
	// deduplicate the dead-letter topic, which is written at least once.
	MetaOriginOffset = "idemq-origin-offset"
	// MetaGroup holds the consumer group that dead-lettered the copy.
	MetaGroup = "idemq-group"
)

// deadLetterStuckAfter is the number of consecutive failed dead-letter writes
// of one message after which the source logs each further failure at Error
// level and counts the message in Stats.DeadLetterStuck.
const deadLetterStuckAfter = 3

// Ordering says which messages the runner handles one after another.
type Ordering int

const (
	// OrderByKey makes the Kafka message key the PartitionKey: messages with
	// the same key are handled in offset order, messages with different keys
	// (even in the same partition) concurrently. Messages without a key are
	// not ordered. This is the default.
	OrderByKey Ordering = iota
	// OrderByPartition makes "topic/partition" the PartitionKey: every
	// partition is handled strictly in offset order, so a runner handles at
	// most as many partitions concurrently as its Concurrency.
	OrderByPartition
)

// String returns the ordering's name.
func (o Ordering) String() string {
	switch o {
	case OrderByKey:
		return "OrderByKey"
	case OrderByPartition:
		return "OrderByPartition"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// Config configures a Source. Brokers, Topics and GroupID are required; every
// other zero field is replaced by its default in WithDefaults.
type Config struct {
	// Brokers are the bootstrap addresses (host:port) of the Kafka cluster.
	// Required.
	Brokers []string

	// Topics are the topics consumed. Required: at least one.
	Topics []string

	// GroupID is the consumer group. Every Source with the same GroupID
	// shares the topics' partitions, and committed offsets belong to it.
	// Required.
	GroupID string

	// Dialer opens every connection of the reader and of the dead-letter
	// writer (pass it to CreateTopics and DeleteTopics too): set its TLS and
	// SASLMechanism fields for a secured cluster, ClientID to name the
	// client, DialFunc to route connections (for example to an in-process
	// broker). Its Resolver is not used by the dead-letter writer. Defaults
	// to kafka.DefaultDialer (plaintext, 10 s dial timeout).
	Dialer *kafka.Dialer

	// ConnectTimeout bounds the connectivity check of New: one of Brokers
	// must answer a metadata request within it, or New fails with
	// ErrUnreachable instead of returning a Source that waits in silence.
	// Negative skips the check. Defaults to 5 s.
	ConnectTimeout time.Duration

	// StartOffset is where the group starts reading a partition that has no
	// committed offset: kafka.FirstOffset (the oldest retained message) or
	// kafka.LastOffset (only messages produced from now on; older ones are
	// skipped, never processed). Defaults to kafka.FirstOffset.
	StartOffset int64

	// KeyHeader is the message header holding the deduplication key
	// (Message.Key). When a message lacks it, Message.Key is empty and the
	// runner's default key is Message.ID (topic/partition/offset); see the
	// package documentation for what that fallback does not catch.
	// Defaults to DefaultKeyHeader ("idempotency-key").
	KeyHeader string

	// KeyFunc, when set, computes Message.Key from the Kafka message instead
	// of KeyHeader (for example from a field of the body). An empty result
	// means "no key", as a missing header does. A panic is recovered: the
	// message is dead-lettered with consumer.ErrMissingKey and the panic as
	// the reason. It is called from one goroutine. Defaults to nil.
	KeyFunc func(kafka.Message) string

	// Ordering chooses the PartitionKey: the Kafka message key
	// (OrderByKey) or the partition (OrderByPartition). Defaults to
	// OrderByKey.
	Ordering Ordering

	// MaxInFlight bounds the messages fetched and not yet settled that are
	// handed out by Receive or waiting for a retry: fetching pauses when it
	// is reached. Messages held behind a retried message of their key do
	// not count (MaxUncommitted bounds them), and are handed out without
	// waiting for a free slot when released. Keep it at least 2 × BatchSize
	// × Concurrency of the runner, or lanes go idle. Defaults to 1000.
	MaxInFlight int

	// MaxUncommitted bounds the messages fetched and not yet passed by their
	// partition's settled prefix: unsettled ones, held ones, and settled
	// ones that wait behind an unsettled message of their partition for
	// their offset to be committed. When it is reached, fetching pauses for
	// every partition (kafka-go's Reader cannot pause one) until the
	// blocking messages are settled. It bounds the source's memory when a
	// message stays unsettled for long: a long retry backoff, or a
	// dead-letter write that keeps failing. Must be at least MaxInFlight.
	// Defaults to the larger of 10000 and MaxInFlight.
	MaxUncommitted int

	// QueueCapacity is the capacity of kafka-go's internal queue of
	// prefetched messages. Defaults to 100.
	QueueCapacity int

	// MinBytes is the least data a fetch waits for (up to MaxWait) before
	// the broker answers. Defaults to 1.
	MinBytes int

	// MaxBytes is the most data one fetch returns. The broker still returns
	// a single record batch larger than this, so it does not cap the
	// message size. Defaults to 1 MiB.
	MaxBytes int

	// MaxWait is how long a fetch waits for MinBytes. Defaults to 1 s.
	MaxWait time.Duration

	// IsolationLevel is kafka.ReadCommitted to skip messages of aborted
	// producer transactions, or kafka.ReadUncommitted. Defaults to
	// kafka.ReadUncommitted (the zero value).
	IsolationLevel kafka.IsolationLevel

	// SessionTimeout is how long the group coordinator waits without a
	// heartbeat before it evicts a member and gives its partitions to the
	// others: how long a killed consumer's partitions stall, and how long a
	// live member may freeze before it is evicted for nothing
	// (docs/sources.md, "Session timeout", has the trade-off). The broker
	// refuses values outside group.min.session.timeout.ms (6 s by default)
	// and group.max.session.timeout.ms. Defaults to 10 s.
	SessionTimeout time.Duration

	// HeartbeatInterval is how often the member heartbeats; it is also how
	// soon a member learns that a rebalance started, so it adds up to one
	// interval to the stall after a kill. Must be below
	// SessionTimeout. Defaults to 1 s.
	HeartbeatInterval time.Duration

	// RebalanceTimeout is how long the coordinator waits for every member to
	// rejoin during a rebalance. Defaults to 30 s.
	RebalanceTimeout time.Duration

	// JoinGroupBackoff is the delay before rejoining the group after an
	// error, such as the coordinator being unreachable: it bounds how long
	// the Source takes to rejoin once the broker answers again. Defaults
	// to 200 ms.
	JoinGroupBackoff time.Duration

	// CommitInterval is how often the settled offsets are committed (and
	// always when the group rebalances and on Close). A crash loses at most
	// the last CommitInterval of commits: those messages are redelivered,
	// and the deduplication record absorbs them. Defaults to 1 s.
	CommitInterval time.Duration

	// CommitTimeout bounds queueing an offset commit (Ack, DeadLetter) and
	// the request Close sends, when the caller's context has no earlier
	// deadline. Defaults to 10 s.
	CommitTimeout time.Duration

	// DeadLetterTopic is the topic every dead-lettered message is written
	// to. The topic must exist unless the cluster creates topics
	// automatically (CreateTopics creates it). Defaults to each consumed
	// topic's own "<topic>.dlq" (see DeadLetterTopic).
	DeadLetterTopic string

	// DeadLetterTimeout bounds one dead-letter write when the caller's
	// context has no earlier deadline. Defaults to 10 s.
	DeadLetterTimeout time.Duration

	// DeadLetterRetryDelay is how long a message whose dead-letter write
	// failed waits, uncommitted, before it is handed out again (see
	// Source.DeadLetter for what a write that never succeeds blocks).
	// Defaults to 5 s.
	DeadLetterRetryDelay time.Duration

	// Logger receives the source's logs (rebalances, skipped stale
	// commits, failed commits and dead-letter writes) and kafka-go's own
	// logs (at Debug, errors at Warn). Defaults to a logger that discards
	// everything.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
// It does not copy the Brokers and Topics slices.
func (c Config) WithDefaults() Config {
	c.Dialer = cmp.Or(c.Dialer, kafka.DefaultDialer)
	c.StartOffset = cmp.Or(c.StartOffset, kafka.FirstOffset)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, 5*time.Second)
	c.KeyHeader = cmp.Or(c.KeyHeader, DefaultKeyHeader)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, 1000)
	c.MaxUncommitted = cmp.Or(c.MaxUncommitted, max(10000, c.MaxInFlight))
	c.QueueCapacity = cmp.Or(c.QueueCapacity, 100)
	c.MinBytes = cmp.Or(c.MinBytes, 1)
	c.MaxBytes = cmp.Or(c.MaxBytes, 1<<20)
	c.MaxWait = cmp.Or(c.MaxWait, time.Second)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, 10*time.Second)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, time.Second)
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, 30*time.Second)
	c.JoinGroupBackoff = cmp.Or(c.JoinGroupBackoff, 200*time.Millisecond)
	c.CommitInterval = cmp.Or(c.CommitInterval, time.Second)
	c.CommitTimeout = cmp.Or(c.CommitTimeout, 10*time.Second)
	c.DeadLetterTimeout = cmp.Or(c.DeadLetterTimeout, 10*time.Second)
	c.DeadLetterRetryDelay = cmp.Or(c.DeadLetterRetryDelay, 5*time.Second)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// deadLetterTopic returns the dead-letter topic for messages of topic.
func (c Config) deadLetterTopic(topic string) string {
	return cmp.Or(c.DeadLetterTopic, DeadLetterTopic(topic))
}

// maxTopicLength is Kafka's limit on topic names.
const maxTopicLength = 249

// validate reports every invalid field of c.
func (c Config) validate() error {
	l := cfgerr.List{Prefix: "kafkasource.Config."}
	if len(c.Brokers) == 0 {
		l.Add("Brokers", "required")
	} else if slices.ContainsFunc(c.Brokers, func(b string) bool { return strings.TrimSpace(b) == "" }) {
		l.Add("Brokers", "contains an empty address")
	}
	if len(c.Topics) == 0 {
		l.Add("Topics", "required")
	}
	seen := make(map[string]bool, len(c.Topics))
	for _, t := range c.Topics {
		switch {
		case t == "":
			l.Add("Topics", "contains an empty topic name")
		case len(t) > maxTopicLength:
			l.Addf("Topics", "topic name %.20q... longer than %d bytes", t, maxTopicLength)
		case seen[t]:
			l.Addf("Topics", "topic %q listed twice", t)
		case c.deadLetterTopic(t) == t:
			l.Addf("DeadLetterTopic", "routes dead letters back to consumed topic %q", t)
		}
		seen[t] = true
	}
	if c.GroupID == "" {
		l.Add("GroupID", "required")
	}
	if c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset {
		l.Add("StartOffset", "must be kafka.FirstOffset or kafka.LastOffset")
	}
	if c.Ordering != OrderByKey && c.Ordering != OrderByPartition {
		l.Addf("Ordering", "unknown value %d", int(c.Ordering))
	}
	if l.Positive("MaxInFlight", c.MaxInFlight) && c.MaxUncommitted < c.MaxInFlight {
		l.Add("MaxUncommitted", "must be at least MaxInFlight")
	}
	l.Positive("QueueCapacity", c.QueueCapacity)
	if l.Positive("MinBytes", c.MinBytes) && c.MaxBytes < c.MinBytes {
		l.Add("MaxBytes", "smaller than MinBytes")
	}
	l.NotNegative("MaxWait", c.MaxWait)
	if c.IsolationLevel != kafka.ReadUncommitted && c.IsolationLevel != kafka.ReadCommitted {
		l.Addf("IsolationLevel", "unknown value %d", int(c.IsolationLevel))
	}
	l.NotNegative("SessionTimeout", c.SessionTimeout)
	if l.NotNegative("HeartbeatInterval", c.HeartbeatInterval) && c.SessionTimeout >= 0 && c.HeartbeatInterval >= c.SessionTimeout {
		l.Add("HeartbeatInterval", "must be below SessionTimeout")
	}
	l.NotNegative("RebalanceTimeout", c.RebalanceTimeout)
	l.NotNegative("JoinGroupBackoff", c.JoinGroupBackoff)
	l.NotNegative("CommitInterval", c.CommitInterval)
	l.NotNegative("CommitTimeout", c.CommitTimeout)
	l.NotNegative("DeadLetterTimeout", c.DeadLetterTimeout)
	l.NotNegative("DeadLetterRetryDelay", c.DeadLetterRetryDelay)
	return l.Err()
}
