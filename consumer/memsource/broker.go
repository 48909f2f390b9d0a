package memsource

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/internal/faults"
	"github.com/idemq/idemq/internal/memqueue"
)

// Errors returned by the broker and its sources. Match them with errors.Is.
var (
	// ErrUnavailable is returned while the broker is unavailable (see
	// SetUnavailable) and by injected receive faults: the error of a broker
	// that cannot be reached. The Runner retries it with backoff.
	ErrUnavailable = errors.New("memsource: broker unavailable")
	// ErrDeliveryExpired is returned when a message is settled through a
	// delivery that no longer counts: its visibility timeout passed, its
	// Source was closed or the broker restarted. The message is redelivered
	// (or was already).
	ErrDeliveryExpired = errors.New("memsource: delivery expired")
	// ErrForeignMessage is returned when a Source is asked to settle a
	// message it did not receive.
	ErrForeignMessage = errors.New("memsource: message was not received by this source")
	// ErrInjected is the default error of an injected fault.
	ErrInjected = errors.New("memsource: injected fault")
)

// Config configures a Broker. The zero value is usable.
type Config struct {
	// VisibilityTimeout is how long a received message stays invisible
	// while it is neither acknowledged, retried nor dead-lettered; after it,
	// the message is delivered again with Attempt increased. A Source can
	// override it with WithVisibilityTimeout. Defaults to 30 s.
	VisibilityTimeout time.Duration
	// Seed seeds the random number generator that decides probabilistic
	// faults, so that a sequence of calls fails the same way on every run.
	// Defaults to 0 (a fixed seed like any other).
	Seed uint64
	// OnEvent, if set, is called with every Event after the step took
	// effect and before the method that caused it returns, outside the
	// broker's lock. It may be called from several goroutines at once.
	// Defaults to nil.
	OnEvent func(Event)
	// Logger receives debug logs of injected faults and expired deliveries.
	// Defaults to a logger that discards everything.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.VisibilityTimeout = cmp.Or(c.VisibilityTimeout, 30*time.Second)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// Validate reports every invalid field of c (after WithDefaults), each a
// *idemq.ConfigError; the error matches idemq.ErrInvalidConfig.
func (c Config) Validate() error {
	l := cfgerr.List{Prefix: "memsource.Config."}
	if c.WithDefaults().VisibilityTimeout < 0 {
		l.Addf("VisibilityTimeout", "must not be negative, got %s", c.VisibilityTimeout)
	}
	return l.Err()
}

// Outgoing is a message to publish.
type Outgoing struct {
	// Key surfaces as Message.Key: the deduplication key.
	Key string
	// Body is the payload.
	Body []byte
	// Headers surface as Message.Headers (copied on every delivery);
	// consumer.HeaderReplyTo and consumer.HeaderCorrelationID also
	// surface as Message.ReplyTo and Message.CorrelationID, as on Kafka.
	Headers map[string]string
	// PartitionKey surfaces as Message.PartitionKey and orders delivery:
	// see the package documentation.
	PartitionKey string
}

// DeadLetter is a message moved to a topic's dead-letter list.
type DeadLetter struct {
	// ID, Key, Body, Headers and PartitionKey are the message's.
	ID           string
	Key          string
	Body         []byte
	Headers      map[string]string
	PartitionKey string
	// Reason is Err.Error(); Err is the reason passed to DeadLetter.
	Reason string
	Err    error
	// Attempts is the Attempt of the delivery that was dead-lettered.
	Attempts int
	// At is when the message was dead-lettered.
	At time.Time
}

// TopicStats counts what happened on one topic. Counters only grow;
// Ready, InFlight and Pending are the current state.
type TopicStats struct {
	// Published is the number of messages published.
	Published uint64
	// Deliveries is the number of deliveries, first ones and redeliveries.
	Deliveries uint64
	// Redeliveries is the number of deliveries with Attempt > 1.
	Redeliveries uint64
	// Acks is the number of messages acknowledged.
	Acks uint64
	// DroppedAcks is the number of acknowledgements dropped or failed by an
	// injected fault.
	DroppedAcks uint64
	// Retries is the number of Retry calls that took effect.
	Retries uint64
	// DeadLettered is the number of messages dead-lettered.
	DeadLettered uint64
	// Expired is the number of deliveries whose visibility timeout passed
	// unsettled.
	Expired uint64
	// Ready is the number of unsettled messages waiting for delivery,
	// including those delayed by Retry.
	Ready int
	// InFlight is the number of unsettled messages currently delivered.
	InFlight int
	// Pending is Ready + InFlight: messages neither acknowledged nor
	// dead-lettered.
	Pending int
}

// Broker is an in-memory message broker with at-least-once delivery, for unit
// tests and demos. Create it with New. It is safe for concurrent use.
type Broker struct {
	cfg Config
	log *slog.Logger

	mu          sync.Mutex
	topics      map[string]*topic
	rng         *rand.Rand
	faults      faults.Script[Fault]
	nextID      uint64
	nextSource  uint64
	seq         uint64
	unavailable bool
	closed      bool
	sources     map[*Source]struct{}
}

// New returns an empty broker. It panics if cfg is invalid (see
// Config.Validate): a broker for tests has no better way to report a
// programming error.
func New(cfg Config) *Broker {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg = cfg.WithDefaults()
	return &Broker{
		cfg:     cfg,
		log:     cfg.Logger,
		topics:  make(map[string]*topic),
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		sources: make(map[*Source]struct{}),
	}
}

// topic is one queue (internal/memqueue) and its dead letters.
type topic struct {
	name  string
	queue *memqueue.Queue[Outgoing, *Source]
	dead  []DeadLetter
	stats TopicStats
}

type (
	// stored is one published message; its Payload is what was published.
	stored = memqueue.Message[Outgoing, *Source]
	// delivery is one handing-out of a message to a Source; it is the
	// consumer.Delivery.Handle of memsource messages.
	delivery = memqueue.Delivery[Outgoing, *Source]
)

// topicLocked returns the topic named name, creating it. b.mu is held.
func (b *Broker) topicLocked(name string) *topic {
	t := b.topics[name]
	if t == nil {
		t = &topic{name: name, queue: memqueue.New[Outgoing, *Source]()}
		b.topics[name] = t
	}
	return t
}

// Publish appends msgs to topic, in order, and returns their IDs. Topics are
// created on first use. Publishing works even while the broker is
// unavailable or closed: it is the test's setup, not the system under test.
func (b *Broker) Publish(topicName string, msgs ...Outgoing) []string {
	b.mu.Lock()
	t := b.topicLocked(topicName)
	ids := make([]string, len(msgs))
	events := make([]Event, 0, len(msgs))
	for i, o := range msgs {
		b.nextID++
		o.Headers = maps.Clone(o.Headers)
		o.Body = append([]byte(nil), o.Body...)
		m := t.queue.Publish(fmt.Sprintf("mem-%d", b.nextID), o.PartitionKey, o)
		t.stats.Published++
		ids[i] = m.ID
		events = append(events, b.event(EventPublish, t, nil, m, 0, nil))
	}
	if len(msgs) > 0 {
		t.queue.Wake()
	}
	b.mu.Unlock()
	b.emit(events...)
	return ids
}

// Stats returns the counters and current state of topic (zero for a topic
// never used).
func (b *Broker) Stats(topicName string) TopicStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.topics[topicName]
	if t == nil {
		return TopicStats{}
	}
	st := t.stats
	st.Ready, st.InFlight = t.queue.Counts()
	st.Pending = st.Ready + st.InFlight
	return st
}

// DeadLetters returns a copy of the messages dead-lettered from topic, in the
// order they were dead-lettered.
func (b *Broker) DeadLetters(topicName string) []DeadLetter {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.topics[topicName]
	if t == nil {
		return nil
	}
	out := make([]DeadLetter, len(t.dead))
	for i, d := range t.dead {
		d.Headers = maps.Clone(d.Headers)
		d.Body = append([]byte(nil), d.Body...)
		out[i] = d
	}
	return out
}

// Restart simulates a broker restart that keeps its (durable) messages: every
// outstanding delivery is invalidated, so its message is delivered again at
// once with Attempt increased and settling the old delivery fails with
// ErrDeliveryExpired, like a delivery tag after a reconnect. Open sources
// stay usable, as if they had reconnected.
func (b *Broker) Restart() {
	b.mu.Lock()
	var events []Event
	for _, t := range b.topics {
		t.queue.Release(nil, true, func(m *stored) {
			events = append(events, b.event(EventReturn, t, nil, m, m.Deliveries, nil))
		})
	}
	events = append(events, b.event(EventRestart, nil, nil, nil, 0, nil))
	b.mu.Unlock()
	b.emit(events...)
}

// SetUnavailable makes the broker unreachable (true) or reachable again
// (false). While unreachable, Receive, Ack, Retry and DeadLetter fail with
// ErrUnavailable and blocked Receive calls return it; nothing changes state,
// and visibility timeouts keep running.
func (b *Broker) SetUnavailable(down bool) {
	b.mu.Lock()
	b.unavailable = down
	for _, t := range b.topics {
		t.queue.Wake()
	}
	b.mu.Unlock()
}

// Close closes every Source of the broker (their unsettled messages return to
// their topics). Sources opened afterwards fail with consumer.ErrClosed.
// Close is idempotent.
func (b *Broker) Close() error {
	b.mu.Lock()
	b.closed = true
	srcs := make([]*Source, 0, len(b.sources))
	for s := range b.sources {
		srcs = append(srcs, s)
	}
	b.mu.Unlock()
	for _, s := range srcs {
		_ = s.Close()
	}
	return nil
}
