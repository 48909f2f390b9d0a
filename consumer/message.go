package consumer

import (
	"context"
	"strings"
	"time"
)

// Message is one delivery of a broker message.
//
// Sources fill it; handlers read it. A handler must not modify a Message or
// keep it after returning. The same broker message delivered twice yields two
// Message values with the same ID (and Key) but, for example, a higher Attempt.
type Message struct {
	// ID is the broker's identifier of the message: stable across
	// redeliveries where the broker gives one (SQS MessageId, AMQP
	// message-id property); Kafka sources use topic/partition/offset.
	ID string
	// Key is the deduplication key the source found in the message (an
	// idempotency header or attribute), or empty. Config.KeyFunc decides
	// the key the runner records; by default it is Key, else ID.
	Key string
	// Body is the payload.
	Body []byte
	// Fingerprint, when not nil, is what the runner hashes into the
	// record's payload hash instead of Body: the same key with another
	// Fingerprint is a payload mismatch (ErrPayloadMismatch), never a
	// duplicate. A source sets it when more than the body identifies a
	// request (httpsource: the method and the target, then the body).
	// Defaults to nil: the payload hash is Body's. Read-only.
	Fingerprint []byte
	// Headers holds the message's headers or string attributes.
	Headers map[string]string
	// PartitionKey orders messages: messages with the same non-empty
	// PartitionKey are handled one after another, in delivery order, by
	// one runner (Kafka message key, SQS MessageGroupId, ...).
	PartitionKey string
	// Topic is the topic or queue the message was received from.
	Topic string
	// Attempt is the broker's delivery count, starting at 1. It also rises
	// for deliveries to consumers that crashed or were killed; the runner's
	// retry policy uses the store's count of handler failures instead where
	// the store keeps one (see RetryPolicy.MaxAttempts).
	Attempt int
	// Redelivered reports that the broker delivered the message before.
	Redelivered bool
	// ReplyTo is where the message's producer asks for a reply, or empty
	// when it asks for none: the AMQP reply_to property (a queue name,
	// reached through the default exchange), the Kafka header
	// HeaderReplyTo (a topic) or the SQS message attribute HeaderReplyTo
	// (a queue URL or name). sinks/outbox's Reply sends the handler's
	// result there through the transactional outbox. Read-only.
	ReplyTo string
	// CorrelationID is the id the producer asks its reply to carry: the
	// AMQP correlation_id property, or the Kafka header or SQS message
	// attribute HeaderCorrelationID; empty when absent. Read-only.
	CorrelationID string
	// ReceivedAt is when the source received the message.
	ReceivedAt time.Time
	// Raw is the broker's native message (for example a kafka.Message, an
	// SQS types.Message or an amqp091.Delivery); each source documents its
	// type. Read-only.
	Raw any
	// Broker says where the message came from, for telemetry; see
	// BrokerInfo. Read-only.
	Broker BrokerInfo

	// delivery is what the Source that produced the message attached
	// (see Deliver).
	delivery Delivery
	// keys is the scope and key the runner recorded, set once the runner
	// computed the key (see KeyContext); its key is empty before. A value,
	// not a pointer: setting it costs no allocation per message.
	keys msgKeys
	// res is the message's result (see StoredResult, result.go).
	res resultSlot
}

// Delivery is what a Source attaches to a Message it produces (Deliver) and
// alone reads back (DeliveryOf). Nothing else may touch it.
type Delivery struct {
	// Handle is the Source's bookkeeping (receipt handles, delivery tags,
	// offsets).
	Handle any
	// KeyErr, when set, says why the Source could not read the message's
	// key (for example its own key function panicked). The runner then
	// dead-letters the message at once with an error wrapping
	// ErrMissingKey and KeyErr, whatever Config.KeyFunc would say.
	KeyErr error
}

// Deliver attaches d to m, a Message the calling Source produces, and
// returns m. It is how a Source gives a message its Delivery.
func Deliver(m *Message, d Delivery) *Message {
	m.delivery = d
	return m
}

// DeliveryOf returns the Delivery the Source that produced m attached to
// it; the zero Delivery if none. Only that Source reads it.
func DeliveryOf(m *Message) Delivery { return m.delivery }

// msgKeys is the consumer's name and the deduplication key of a message.
type msgKeys struct{ scope, key string }

// KeyContext returns ctx carrying m's keys, as the ctx of a single-message
// handler does: DedupKey and IdempotencyKey of the returned context give
// m's. Inside a TransactionalBatch handler, whose ctx carries no message's
// key, pass it to what needs one message's key, for example
//
//	for _, m := range msgs {
//		_, err := outbox.Publish(m.KeyContext(ctx), tx, outbox.Message{Destination: "events", Body: m.Body})
//		...
//	}
//
// The runner sets m's keys once it has computed its key, before the key is
// claimed, so that hooks (HookClaimed, HookSettled) and batch handlers can
// use it. It returns ctx unchanged for a message whose key is not known yet
// (before its batch is prepared, or when its key could not be read).
func (m *Message) KeyContext(ctx context.Context) context.Context {
	if m.keys.key == "" {
		return ctx
	}
	return withKeys(ctx, &m.keys)
}

type ctxKey int

const (
	ctxKeyKeys ctxKey = iota + 1 // *msgKeys
	ctxKeyToken
)

// DedupKey returns the deduplication key the runner recorded for the message
// being handled in ctx. It is the same on every attempt. Effects that leave
// the process (webhooks, payment APIs, emails) should forward
// IdempotencyKey(ctx), which also names the consumer, to the downstream
// system, so that the downstream deduplicates too.
func DedupKey(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(ctxKeyKeys).(*msgKeys)
	if !ok {
		return "", false
	}
	return k.key, true
}

// IdempotencyKey returns the key that an effect leaving the process should
// carry (for example as an Idempotency-Key header): the consumer's Name and
// the message's deduplication key, "<name>:<key>", where every '%' in the
// name is written "%25" and every ':' in it "%3A". The escaped name holds no
// ':', so the first ':' ends it and the encoding is injective: Name
// "orders:eu" with key "1" gives "orders%3Aeu:1", Name "orders" with key
// "eu:1" gives "orders:eu:1". A name without '%' or ':' appears unchanged.
//
// The key is the same on every attempt and redelivery of one message to one
// consumer, and differs between consumers, so that two consumers of one
// message (two different effects) never share a key at a downstream that
// deduplicates across its whole account.
func IdempotencyKey(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(ctxKeyKeys).(*msgKeys)
	if !ok {
		return "", false
	}
	return scopeEscaper.Replace(k.scope) + ":" + k.key, true
}

// scopeEscaper percent-escapes the characters that would make "<name>:<key>"
// ambiguous, as dedup/redisdedup does for its Redis key names.
var scopeEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// LeaseToken returns the token of the lease held for the message being
// handled in ctx (lease path only). It changes on every attempt; use DedupKey
// for idempotency keys.
func LeaseToken(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(ctxKeyToken).(string)
	return k, ok
}

// withKeys returns ctx carrying k, which DedupKey and IdempotencyKey read:
// one value for both, the Message's own, so that a handler call allocates
// no copy of them.
func withKeys(ctx context.Context, k *msgKeys) context.Context {
	return context.WithValue(ctx, ctxKeyKeys, k)
}

// resultSlot is what a Message carries of its result: the result its
// handler returned (set by TxResult and Result), or the result stored with
// its key (set by the runner on a duplicate), and whether the runner
// settled the message as handled or as a duplicate.
type resultSlot struct {
	value    []byte
	returned bool        // the handler's adapter returned value
	state    resultState // set by the runner, before Ack
	err      error       // lease path: why the result was not stored
}

// resultState says whose result a Message carries, as StoredResult reports
// it.
type resultState uint8

const (
	resultUnknown  resultState = iota // not settled, or not acknowledged
	resultFresh                       // the handler ran and its effect is durable
	resultReplayed                    // a duplicate: the stored result
)

// StoredResult returns the stored result of m once the runner has settled
// it as handled or as a duplicate, which it does before it passes m to the
// Source's Ack: ok is false before, and for messages retried or
// dead-lettered. For a handled message, result is what its handler returned
// through TxResult, TxResultJSON, Result or ResultJSON, and replayed is
// false. For a duplicate (a redelivery, a retried request, or a second copy
// of the key in one batch), result is the result stored with the key's
// record, byte for byte, and replayed is true. result is nil when the
// handler returned none (a plain TxHandler or Handler, a TransactionalBatch
// handler that set none with SetResult, or a record written before results
// were stored). A Source that answers its producer (sources/httpsource, a
// request/reply consumer) reads it in Ack; nothing else should. The slice
// must not be modified.
func StoredResult(m *Message) (result []byte, replayed bool, ok bool) {
	switch m.res.state {
	case resultFresh:
		return m.res.value, false, true
	case resultReplayed:
		return m.res.value, true, true
	}
	return nil, false, false
}

// SetResult records b as m's result, to be stored with m's record and
// returned to m's duplicates (StoredResult), as the result a TxResult or
// Result handler returns. It is how a TransactionalBatch handler
// returns a result per message: call it from the handler, for the messages
// it was given, before it returns (the last call for a message wins). A
// handler run again (after a failure, or a batch-mate's) starts with no
// result. A result above Config.MaxResultBytes dead-letters m with
// ErrResultTooLarge, and its batch-mates run again without it. b must not
// be modified afterwards.
func (m *Message) SetResult(b []byte) { m.setReturned(b, true) }

// setReturned records the result a handler returned (or, with ok false,
// forgets a result of an earlier run of the handler).
func (m *Message) setReturned(b []byte, ok bool) {
	m.res.value, m.res.returned, m.res.err = b, ok, nil
}

// Header names of a request that asks for a reply, on brokers whose
// messages have no reply properties of their own (Kafka headers, SQS
// message attributes). kafkasource and sqssource read them into
// Message.ReplyTo and Message.CorrelationID; amqpsource reads the AMQP
// reply_to and correlation_id properties instead. sinks/outbox's Reply
// writes HeaderCorrelationID on the reply (and, on RabbitMQ, its
// correlation_id property).
const (
	// HeaderReplyTo names where the reply goes: a Kafka topic, or an SQS
	// queue URL or name.
	HeaderReplyTo = "idemq-reply-to"
	// HeaderCorrelationID is the id the requester matches its reply by.
	HeaderCorrelationID = "idemq-correlation-id"
)
