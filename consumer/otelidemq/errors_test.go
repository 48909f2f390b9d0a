package otelidemq_test

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/dedup/memdedup"
)

// declinedError is a handler's own error type, wrapped before it is
// returned.
type declinedError struct{}

func (*declinedError) Error() string { return "card declined" }

// exceptionType returns the exception.type of s's exception event.
func exceptionType(s sdktrace.ReadOnlySpan) (string, bool) {
	for _, e := range s.Events() {
		if e.Name != semconv.ExceptionEventName {
			continue
		}
		for _, a := range e.Attributes {
			if a.Key == semconv.ExceptionTypeKey {
				return a.Value.AsString(), true
			}
		}
	}
	return "", false
}

// A failed process span carries error.type, as the conventions require of a
// failed operation, and the handler span's exception names the type of the
// handler's error, not the type of the wrapper around it.
func TestFailedSpansNameTheirError(t *testing.T) {
	tel := newTelemetry(t, otelidemq.Config{})
	store := memStore(t)
	b := memBroker(t, memsource.Config{})
	b.Publish("orders", memsource.Outgoing{Key: "k1"})
	r := tel.runner(t, b.Source("orders"), consumer.Transactional(store, func(context.Context, *memdedup.Tx, *consumer.Message) error {
		return consumer.Permanent(fmt.Errorf("charge: %w", &declinedError{}))
	}), consumer.Config{})
	runIdle(t, r)
	var process []sdktrace.ReadOnlySpan
	for _, ss := range tel.processSpans() {
		process = append(process, ss...)
	}
	if len(process) != 1 {
		t.Fatalf("%d process spans, want 1", len(process))
	}
	p := process[0]
	if p.Status().Code != codes.Error {
		t.Errorf("dead-lettered message's process span has status %v, want Error", p.Status())
	}
	if v, ok := attr(p, otelidemq.AttrErrorType); !ok || v.AsString() != "permanent" {
		t.Errorf("process span %s = %q (present %v), want %q", otelidemq.AttrErrorType, v.AsString(), ok, "permanent")
	}
	h, ok := tel.children(p)["handler"]
	if !ok {
		t.Fatal("no handler span")
	}
	if v, ok := attr(h, otelidemq.AttrErrorType); !ok || v.AsString() != "permanent" {
		t.Errorf("handler span %s = %q (present %v), want %q", otelidemq.AttrErrorType, v.AsString(), ok, "permanent")
	}
	want := fmt.Sprintf("%T", &declinedError{}) // *otelidemq_test.declinedError
	if got, ok := exceptionType(h); !ok || got != want {
		t.Errorf("handler span exception.type %q (present %v), want the cause's %q", got, ok, want)
	}
}

// A failed transaction's span (SpanPerTransaction) carries error.type.
func TestFailedTransactionSpanHasErrorType(t *testing.T) {
	tel := newTelemetry(t, otelidemq.Config{SpanPerTransaction: true})
	b, r, _ := batchRunner(t, tel, "pertx", "orders", "k1")
	b.Publish("orders", memsource.Outgoing{Key: "k0", Body: []byte(`{"K":"k0"}`)}, memsource.Outgoing{Key: "k1", Body: []byte(`{"K":"k1"}`)})
	runIdle(t, r)
	var failed int
	for _, s := range tel.spans.Ended() {
		if s.Status().Code != codes.Error || s.Name() != "process orders" {
			continue
		}
		failed++
		if v, ok := attr(s, otelidemq.AttrErrorType); !ok || v.AsString() == "" {
			t.Errorf("failed transaction span without %s: %v", otelidemq.AttrErrorType, s.Attributes())
		}
	}
	if failed == 0 {
		t.Fatal("no failed transaction span")
	}
}

// noIDSource hands out its messages without a message ID, as RabbitMQ does
// when the publisher set no message-id.
type noIDSource struct{ consumer.Source }

func (s noIDSource) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	msgs, err := s.Source.Receive(ctx, max)
	for _, m := range msgs {
		m.ID = ""
	}
	return msgs, err
}

// brokerSource hands out its messages with the BrokerInfo broker, as a
// source of that broker would.
type brokerSource struct {
	consumer.Source
	broker consumer.BrokerInfo
}

func (s brokerSource) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	msgs, err := s.Source.Receive(ctx, max)
	for _, m := range msgs {
		m.Broker = s.broker
	}
	return msgs, err
}

// messaging.message.id is the broker's message ID: left out where the
// source made the ID itself (Kafka, whose messages have none: the source's
// ID is made of topic, partition and offset, which have attributes of their
// own), and when a message has none.
func TestMessageIDAttribute(t *testing.T) {
	for _, c := range []struct {
		name       string
		broker     consumer.BrokerInfo
		noID, want bool
	}{
		{"rabbitmq", consumer.BrokerInfo{System: "rabbitmq"}, false, true},
		{"rabbitmq without message-id", consumer.BrokerInfo{System: "rabbitmq"}, true, false},
		{"kafka", consumer.BrokerInfo{System: "kafka", SyntheticID: true}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tel := newTelemetry(t, otelidemq.Config{})
			store := memStore(t)
			b := memBroker(t, memsource.Config{})
			b.Publish("orders", memsource.Outgoing{Key: "k1"})
			var src consumer.Source = brokerSource{b.Source("orders"), c.broker}
			if c.noID {
				src = noIDSource{src}
			}
			r := tel.runner(t, src, consumer.Transactional(store, succeed), consumer.Config{})
			runIdle(t, r)
			var n int
			for _, s := range tel.spans.Ended() {
				if s.Name() != "process orders" {
					continue
				}
				n++
				v, ok := attr(s, otelidemq.AttrMessageID)
				if ok != c.want || (ok && v.AsString() == "") {
					t.Errorf("%s = %q (present %v), want present %v and never empty", otelidemq.AttrMessageID, v.AsString(), ok, c.want)
				}
			}
			if n != 1 {
				t.Fatalf("%d process spans, want 1", n)
			}
		})
	}
}
