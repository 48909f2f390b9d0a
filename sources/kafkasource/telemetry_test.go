package kafkasource

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
// the telemetry follows, with the destination's apart from the message's.
func TestMessageBroker(t *testing.T) {
	b := messageBroker(brokerInfo("127.0.0.1:9092"), "g", 3, 42, "order-7")
	if b.System != semconv.MessagingSystemKafka.Value.AsString() || b.ServerAddress != "127.0.0.1" || b.ServerPort != 9092 ||
		b.SettleName != "commit" || !b.SyntheticID || !b.UnmarkedRedeliveries {
		t.Errorf("broker %+v", b)
	}
	for _, c := range []struct {
		what      string
		got, want []attribute.KeyValue
	}{
		{"Attrs", otelAttrs(b.Attrs), []attribute.KeyValue{semconv.MessagingConsumerGroupName("g"), semconv.MessagingDestinationPartitionID("3")}},
		{"MessageAttrs", otelAttrs(b.MessageAttrs), []attribute.KeyValue{semconv.MessagingKafkaOffset(42), semconv.MessagingKafkaMessageKey("order-7")}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s %v, want %v", c.what, c.got, c.want)
		}
	}
	// Without a key.
	b = messageBroker(brokerInfo("127.0.0.1:9092"), "g", 0, 7, "")
	if got, want := otelAttrs(append(b.Attrs, b.MessageAttrs...)), []attribute.KeyValue{semconv.MessagingConsumerGroupName("g"), semconv.MessagingDestinationPartitionID("0"), semconv.MessagingKafkaOffset(7)}; !slices.Equal(got, want) {
		t.Errorf("attributes %v, want %v", got, want)
	}
}
