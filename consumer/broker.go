package consumer

import (
	"strconv"
	"strings"
)

// BrokerInfo says where a delivery came from, in its broker's own terms, so
// that telemetry (consumer/otelidemq) can name it the way the OpenTelemetry
// messaging conventions do without knowing the broker. Sources fill what
// their broker knows; the runner never reads it. The zero value means
// unknown: a field left empty is left out of the telemetry.
//
// The attributes are OpenTelemetry attributes, keyed by their names in the
// messaging semantic conventions (for example
// "messaging.destination.partition.id" or "messaging.kafka.offset"); each
// source documents those it fills. Telemetry copies them as they are.
type BrokerInfo struct {
	// System is the messaging system, as messaging.system names it (for
	// example "kafka", "aws_sqs" or "rabbitmq").
	System string
	// ServerAddress and ServerPort are the broker endpoint the source
	// connected to; ServerPort is 0 when unknown.
	ServerAddress string
	ServerPort    int
	// Attrs are the attributes of the message's destination, those every
	// message received from it shares (its partition, the consumer group,
	// ...). The attribute "messaging.destination.name", when present,
	// names the destination in place of Message.Topic. Telemetry may keep
	// what it builds from them for the next message with the same ones, so
	// a source puts nothing per message here.
	Attrs []BrokerAttr
	// MessageAttrs are the attributes of this delivery alone (its offset,
	// delivery tag, ...).
	MessageAttrs []BrokerAttr
	// SettleName is the broker's name for an acknowledgement, the
	// messaging.operation.name of a settle (for example "commit" where
	// acknowledging commits an offset). Empty means "ack".
	SettleName string
	// SyntheticID is true when Message.ID is made by the source from where
	// the message sits (a log's topic, partition and offset) rather than
	// given to the message by the broker or its producer: telemetry then
	// reports no message ID. Defaults to false.
	SyntheticID bool
	// UnmarkedRedeliveries is true when the broker does not mark every
	// redelivery (a log that hands a message out again after a rebalance,
	// with Attempt 1 and Redelivered false): a duplicate the runner takes
	// for the producer's re-send (DuplicateProducer) may then be a
	// redelivery, which telemetry reports as a reason unknown. Defaults to
	// false.
	UnmarkedRedeliveries bool
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

// BrokerAttr is one attribute of where a delivery came from: a key and a
// string or integer value, made by StringAttr or IntAttr. The zero value
// is a string attribute with no key, which telemetry leaves out. Values
// are comparable with ==.
type BrokerAttr struct {
	// Key is the attribute's name.
	Key   string
	str   string
	num   int64
	isInt bool
}

// StringAttr returns the string attribute key=value.
func StringAttr(key, value string) BrokerAttr {
	return BrokerAttr{Key: key, str: value}
}

// IntAttr returns the integer attribute key=value.
func IntAttr(key string, value int64) BrokerAttr {
	return BrokerAttr{Key: key, num: value, isInt: true}
}

// Int returns the value of an integer attribute and true, or 0 and false
// for a string attribute.
func (a BrokerAttr) Int() (int64, bool) {
	return a.num, a.isInt
}

// Value returns the value of a string attribute, or of an integer
// attribute in decimal.
func (a BrokerAttr) Value() string {
	if a.isInt {
		return strconv.FormatInt(a.num, 10)
	}
	return a.str
}
