package kafkadlq

import "github.com/segmentio/kafka-go"

// Transports returns the transports of b's admin client and of its writer
// of replayed copies and progress records.
func Transports(b *Broker) (client, writer kafka.RoundTripper) {
	return b.client.Transport, b.writer.Transport
}
