package sourcetest

import (
	"testing"

	"github.com/idemq/idemq/consumer"
)

// testPublishReceiveAck publishes messages, receives and acknowledges all of
// them, and checks that none comes back, neither to the same source nor to a
// new one.
func (s *suite) testPublishReceiveAck(t *testing.T) {
	n := s.scale(25, 2000)
	topic := s.h.NewTopic(t)
	out := outgoing("deliver", n)
	want := byKey(out)
	s.h.Publish(t, topic, out...)

	src := s.open(t, topic)
	seen := make(map[string]int, n)
	receiveKeys(t, src, s.deliveryTimeout(), keysOf(out), func(m *consumer.Message) {
		w, ok := want[m.Key]
		if !ok {
			t.Fatalf("sourcetest: received key %q (id %q) that was never published to %s", m.Key, m.ID, topic)
		}
		checkMessage(t, m, w)
		seen[m.Key]++
		ack(t, src, m)
	})
	if t.Failed() {
		return
	}
	for k, c := range seen {
		if c > 1 {
			t.Logf("sourcetest: key %q was received %d times before acknowledgement (allowed: at-least-once)", k, c)
		}
	}
	if err := src.Close(); err != nil {
		t.Fatalf("sourcetest: Close: %v", err)
	}
	fresh := s.open(t, topic)
	expectQuiet(t, fresh, s.redeliveryTimeout(), "every message was acknowledged, so a new source must receive nothing")
}
