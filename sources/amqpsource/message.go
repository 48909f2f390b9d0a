package amqpsource

import (
	"encoding/hex"
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/dedup"

	"github.com/idemq/idemq/consumer"
)

// handle is consumer.Delivery.Handle for this source: the delivery tag and the channel
// session it is valid on. A tag means nothing on any other channel, so a
// handle whose session died is never acknowledged.
type handle struct {
	src     *Source
	sess    *session
	tag     uint64
	attempt int
	d       amqp.Delivery
}

// maxHeaderCount bounds the retry and delivery counts read from headers, so
// that a hostile publisher's huge count cannot overflow the attempt number
// into a negative one.
const maxHeaderCount = 1 << 29

// bodyHashPrefix starts keys derived from the body (Config.BodyHashKey).
const bodyHashPrefix = "sha256:"

// toMessage converts a delivery into a consumer.Message.
func (s *Source) toMessage(sess *session, d amqp.Delivery, now time.Time) *consumer.Message {
	retries, _ := intHeader(d.Headers[HeaderRetries])
	count, _ := intHeader(d.Headers[headerDeliveryCount])
	key, _ := stringHeader(d.Headers[s.cfg.KeyHeader])
	switch {
	case key != "":
	case d.MessageId != "":
		key = d.MessageId
	case s.cfg.BodyHashKey:
		h := dedup.HashPayload(d.Body)
		key = bodyHashPrefix + hex.EncodeToString(h[:])
	}
	attempt := 1 + int(min(max(retries, 0), maxHeaderCount)) + int(min(max(count, 0), maxHeaderCount))
	var partition string
	if s.cfg.PartitionKeyHeader != "" {
		partition, _ = stringHeader(d.Headers[s.cfg.PartitionKeyHeader])
	}
	return consumer.Deliver(&consumer.Message{
		ID:            d.MessageId,
		Key:           key,
		Body:          d.Body,
		Headers:       stringHeaders(d.Headers),
		PartitionKey:  partition,
		Topic:         s.cfg.Queue,
		Attempt:       attempt,
		Redelivered:   d.Redelivered || retries > 0,
		ReplyTo:       d.ReplyTo,
		CorrelationID: d.CorrelationId,
		ReceivedAt:    now,
		Raw:           d,
		Broker:        s.broker.info(d.Exchange, d.RoutingKey, d.DeliveryTag),
	}, consumer.Delivery{Handle: &handle{src: s, sess: sess, tag: d.DeliveryTag, attempt: attempt, d: d}})
}

// stringHeaders returns the headers whose values have a string form. Nested
// tables and arrays (x-death) are left out; they remain in Message.Raw.
func stringHeaders(t amqp.Table) map[string]string {
	if len(t) == 0 {
		return nil
	}
	m := make(map[string]string, len(t))
	for k, v := range t {
		if s, ok := stringHeader(v); ok {
			m[k] = s
		}
	}
	return m
}

// stringHeader formats a scalar header value.
func stringHeader(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	case bool:
		return strconv.FormatBool(v), true
	case time.Time:
		return v.UTC().Format(time.RFC3339), true
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, float32, float64:
		return fmt.Sprint(v), true
	case amqp.Decimal:
		return fmt.Sprintf("%de-%d", v.Value, v.Scale), true
	}
	return "", false
}

// intHeader reads an integer header value, whatever integer type the
// publisher's client library chose.
func intHeader(v any) (int64, bool) {
	switch v := v.(type) {
	case int8, int16, int32, int64, int:
		return reflect.ValueOf(v).Int(), true
	case uint8, uint16, uint32, uint64:
		return int64(min(reflect.ValueOf(v).Uint(), 1<<62)), true
	case string:
		return parseInt(v)
	case []byte:
		return parseInt(string(v))
	}
	return 0, false
}

// parseInt parses a decimal integer header; a value out of range is not read
// (strconv would return its clamped bound, which callers must not use).
func parseInt(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// copyOf returns a persistent publishing with d's body and properties and a
// copy of its headers, without the broker's per-copy x-delivery-count (a new
// copy starts its own count) and without the user-id property (the broker
// refuses a user-id other than the connection's user).
func copyOf(d amqp.Delivery) amqp.Publishing {
	h := make(amqp.Table, len(d.Headers)+6)
	maps.Copy(h, d.Headers)
	delete(h, headerDeliveryCount)
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
