package amqpsource

import (
	"slices"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/idemq/idemq/consumer"
)

// otelAttrs returns attrs as OpenTelemetry attributes.
func otelAttrs(attrs []consumer.BrokerAttr) []attribute.KeyValue {
	var kvs []attribute.KeyValue
	for _, a := range attrs {
		if n, ok := a.Int(); ok {
			kvs = append(kvs, attribute.Int64(a.Key, n))
		} else {
			kvs = append(kvs, attribute.String(a.Key, a.Value()))
		}
	}
	return kvs
}

// A message's BrokerInfo carries the attributes of the semantic conventions
// the telemetry follows: the destination "{exchange}:{routing key}:{queue}"
// without an empty part nor a routing key equal to the queue's name, the
// routing key, and the delivery tag.
func TestBrokerAttrs(t *testing.T) {
	if systemRabbitMQ != semconv.MessagingSystemRabbitMQ.Value.AsString() {
		t.Errorf("system %q, semconv says %q", systemRabbitMQ, semconv.MessagingSystemRabbitMQ.Value.AsString())
	}
	c := &broker{base: consumer.BrokerInfo{System: systemRabbitMQ}, queue: "q"}
	for _, tc := range []struct {
		exchange, routingKey string
		tag                  uint64
		attrs, msg           []attribute.KeyValue
	}{
		{"amq.direct", "rk", 1,
			[]attribute.KeyValue{semconv.MessagingDestinationName("amq.direct:rk:q"), semconv.MessagingRabbitMQDestinationRoutingKey("rk")},
			[]attribute.KeyValue{semconv.MessagingRabbitMQMessageDeliveryTag(1)}},
		{"amq.direct", "rk", 2, // the same destination again
			[]attribute.KeyValue{semconv.MessagingDestinationName("amq.direct:rk:q"), semconv.MessagingRabbitMQDestinationRoutingKey("rk")},
			[]attribute.KeyValue{semconv.MessagingRabbitMQMessageDeliveryTag(2)}},
		{"", "q", 3, // the default exchange
			[]attribute.KeyValue{semconv.MessagingDestinationName("q"), semconv.MessagingRabbitMQDestinationRoutingKey("q")},
			[]attribute.KeyValue{semconv.MessagingRabbitMQMessageDeliveryTag(3)}},
		{"x", "", 0, []attribute.KeyValue{semconv.MessagingDestinationName("x:q")}, nil},
	} {
		b := c.info(tc.exchange, tc.routingKey, tc.tag)
		if got := otelAttrs(b.Attrs); !slices.Equal(got, tc.attrs) {
			t.Errorf("%q %q: Attrs %v, want %v", tc.exchange, tc.routingKey, got, tc.attrs)
		}
		if got := otelAttrs(b.MessageAttrs); !slices.Equal(got, tc.msg) {
			t.Errorf("%q %q: MessageAttrs %v, want %v", tc.exchange, tc.routingKey, got, tc.msg)
		}
	}
}
