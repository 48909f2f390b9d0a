package kafkasource

import (
	"strconv"

	"github.com/idemq/idemq/consumer"
)

// The OpenTelemetry messaging attributes the source puts in
// consumer.Message.Broker, named as semantic conventions v1.41.0 name them.
const (
	systemKafka     = "kafka"
	attrGroup       = "messaging.consumer.group.name"
	attrPartition   = "messaging.destination.partition.id"
	attrOffset      = "messaging.kafka.offset"
	attrMessageKey  = "messaging.kafka.message.key"
	settleOperation = "commit"
)

// brokerInfo returns the consumer.BrokerInfo of the messages of a source
// reading from the bootstrap address server: system "kafka", an
// acknowledgement named "commit", IDs made of topic, partition and offset,
// and redeliveries after a rebalance unmarked.
func brokerInfo(server string) consumer.BrokerInfo {
	return consumer.BrokerInfo{System: systemKafka, SettleName: settleOperation,
		SyntheticID: true, UnmarkedRedeliveries: true}.WithServer(server)
}

// messageBroker returns b for the message of group at offset of partition,
// with key (the Kafka message key, empty for none): the destination's
// attributes messaging.consumer.group.name and
// messaging.destination.partition.id, and the message's own
// messaging.kafka.offset and messaging.kafka.message.key (when it has one).
// One allocation holds them all.
func messageBroker(b consumer.BrokerInfo, group string, partition int, offset int64, key string) consumer.BrokerInfo {
	attrs := make([]consumer.BrokerAttr, 2, 4)
	attrs[0] = consumer.StringAttr(attrGroup, group)
	attrs[1] = consumer.StringAttr(attrPartition, strconv.Itoa(partition))
	attrs = append(attrs, consumer.IntAttr(attrOffset, offset))
	if key != "" {
		attrs = append(attrs, consumer.StringAttr(attrMessageKey, key))
	}
	b.Attrs, b.MessageAttrs = attrs[:2:2], attrs[2:]
	return b
}
