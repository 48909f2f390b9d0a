package consumer

import (
	"strconv"
	"strings"
)

// BrokerInfo says where a delivery came from, in its broker's own terms, so
// that telemetry (consumer/otelidemq) can name it the way the OpenTelemetry
// messaging conventions do without importing the broker's client. Sources
// fill what their broker knows; the runner never reads it. The zero value
// means unknown: a field left empty (or zero where zero is no valid value)
// is left out of the telemetry.
type BrokerInfo struct {
	// System is the messaging system, as messaging.system names it:
	// "kafka", "aws_sqs" or "rabbitmq".
	System string
	// ServerAddress and ServerPort are the broker endpoint the source
	// connected to (for Kafka, the first bootstrap address).
	ServerAddress string
	ServerPort    int
	// ConsumerGroup is the Kafka consumer group; empty for brokers without
	// consumer groups.
	ConsumerGroup string
	// Partition is the Kafka partition number, in decimal; empty for other
	// brokers.
	Partition string
	// Offset is the Kafka offset of the message; meaningful only where
	// Partition is set.
	Offset int64
	// MessageKey is the Kafka message key, when it has one.
	MessageKey string
	// Exchange and RoutingKey are the AMQP exchange the message was
	// published to (empty for the default exchange) and its routing key.
	Exchange, RoutingKey string
	// DeliveryTag is the AMQP delivery tag (channel-scoped); zero for other
	// brokers.
	DeliveryTag uint64
	// QueueURL is the SQS queue URL.
	QueueURL string
}

// WithServer returns b with ServerAddress and ServerPort taken from
// hostport ("host:port", or a bare host, which leaves ServerPort 0).
func (b BrokerInfo) WithServer(hostport string) BrokerInfo {
	host, port := hostport, 0
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 && !strings.HasSuffix(hostport, "]") {
		if p, err := strconv.Atoi(hostport[i+1:]); err == nil {
			host, port = hostport[:i], p
		}
	}
	b.ServerAddress, b.ServerPort = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), port
	return b
}
