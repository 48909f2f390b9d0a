package sourcetest

import (
	"fmt"
	"testing"

	"github.com/idemq/idemq/consumer"
)

// testOrderedByPartitionKey publishes interleaved messages of several
// partition keys and checks that each partition key's messages are received
// in publish order.
func (s *suite) testOrderedByPartitionKey(t *testing.T) {
	if !s.h.Features.OrderedByPartitionKey {
		t.Skip("sourcetest: Features.OrderedByPartitionKey is false")
	}
	const partitions, perPartition = 3, 15
	topic := s.h.NewTopic(t)
	out := outgoing("order", partitions*perPartition)
	index := make(map[string]int, len(out))
	for i := range out {
		out[i].PartitionKey = fmt.Sprintf("pk-%d", i%partitions)
		index[out[i].Key] = i
	}
	s.h.Publish(t, topic, out...)

	src := s.open(t, topic)
	last := make(map[string]int) // partition key -> publish index of its last new message
	seen := make(map[string]bool)
	receiveKeys(t, src, s.deliveryTimeout(), keysOf(out), func(m *consumer.Message) {
		defer ack(t, src, m)
		if seen[m.Key] {
			return // a redelivery: at-least-once allows it
		}
		seen[m.Key] = true
		if m.PartitionKey != out[index[m.Key]].PartitionKey {
			t.Errorf("sourcetest: key %q has PartitionKey %q, published with %q", m.Key, m.PartitionKey, out[index[m.Key]].PartitionKey)
		}
		i := index[m.Key]
		if prev, ok := last[m.PartitionKey]; ok && prev > i {
			t.Errorf("sourcetest: partition key %q: message %q (published #%d) received after %q (published #%d)",
				m.PartitionKey, m.Key, i, out[prev].Key, prev)
		}
		last[m.PartitionKey] = i
	})
}
