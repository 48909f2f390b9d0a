package consumer_test

import (
	"testing"

	"github.com/idemq/idemq/consumer"
)

// A BrokerAttr keeps its kind: a string stays a string, an integer an
// integer, and equal attributes compare equal.
func TestBrokerAttr(t *testing.T) {
	s := consumer.StringAttr("messaging.destination.partition.id", "3")
	if n, ok := s.Int(); ok || n != 0 || s.Value() != "3" || s.Key != "messaging.destination.partition.id" {
		t.Errorf("StringAttr: Key %q Value %q Int %d %v", s.Key, s.Value(), n, ok)
	}
	i := consumer.IntAttr("messaging.kafka.offset", -42)
	if n, ok := i.Int(); !ok || n != -42 || i.Value() != "-42" {
		t.Errorf("IntAttr: Value %q Int %d %v", i.Value(), n, ok)
	}
	if consumer.StringAttr("k", "1") == consumer.IntAttr("k", 1) {
		t.Error("a string attribute equals an integer one with the same text")
	}
	if a, b := consumer.IntAttr("k", 1), consumer.IntAttr("k", 1); a != b {
		t.Error("equal attributes compare unequal")
	}
}

func TestBrokerInfoWithServer(t *testing.T) {
	for _, c := range []struct {
		in   string
		host string
		port int
	}{
		{"127.0.0.1:9092", "127.0.0.1", 9092},
		{"[::1]:9092", "::1", 9092},
		{"[::1]", "::1", 0},
		{"broker", "broker", 0},
	} {
		b := consumer.BrokerInfo{System: "kafka"}.WithServer(c.in)
		if b.ServerAddress != c.host || b.ServerPort != c.port || b.System != "kafka" {
			t.Errorf("WithServer(%q) = %q %d %q, want %q %d", c.in, b.ServerAddress, b.ServerPort, b.System, c.host, c.port)
		}
	}
}
