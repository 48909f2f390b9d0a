package sqssource

import (
	"testing"

	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
)

// A message's BrokerInfo carries the attributes of the semantic conventions
// the telemetry follows.
func TestBrokerInfo(t *testing.T) {
	const url = "http://127.0.0.1:9324/000000000000/orders"
	b := brokerInfo(url)
	if b.System != semconv.MessagingSystemAWSSQS.Value.AsString() || b.ServerAddress != "127.0.0.1" || b.ServerPort != 9324 ||
		b.SettleName != "delete" || b.SyntheticID || b.UnmarkedRedeliveries || len(b.MessageAttrs) != 0 {
		t.Errorf("broker %+v", b)
	}
	want := semconv.AWSSQSQueueURL(url)
	if len(b.Attrs) != 1 || b.Attrs[0].Key != string(want.Key) || b.Attrs[0].Value() != url {
		t.Errorf("Attrs %v, want [%v]", b.Attrs, want)
	}
	if b := brokerInfo("https://sqs.eu-west-1.amazonaws.com/1/q"); b.ServerPort != 443 {
		t.Errorf("port of an https URL without one: %d, want 443", b.ServerPort)
	}
}
