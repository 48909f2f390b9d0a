package amqpsource

import (
	"sync/atomic"

	"github.com/idemq/idemq/consumer"
)

// The OpenTelemetry messaging attributes the source puts in
// consumer.Message.Broker, named as semantic conventions v1.41.0 name them.
const (
	systemRabbitMQ  = "rabbitmq"
	attrDestination = "messaging.destination.name"
	attrRoutingKey  = "messaging.rabbitmq.destination.routing_key"
	attrDeliveryTag = "messaging.rabbitmq.message.delivery_tag"
)

// destAttrs are the destination attributes of the messages published to
// one exchange with one routing key.
type destAttrs struct {
	exchange, routingKey string
	attrs                []consumer.BrokerAttr
}

// broker makes the consumer.BrokerInfo of the deliveries from queue: base
// with the attributes of their destination and delivery, keeping the latest
// destination's for the next delivery.
type broker struct {
	base  consumer.BrokerInfo
	queue string
	last  atomic.Pointer[destAttrs]
}

// info returns base with the attributes of delivery tag, published to
// exchange with routingKey: messaging.destination.name "{exchange}:{routing
// key}:{queue}" (leaving out an empty exchange or routing key, and the
// routing key when it is the queue's name), messaging.rabbitmq.destination.routing_key when there
// is one, and messaging.rabbitmq.message.delivery_tag when tag is not 0.
func (c *broker) info(exchange, routingKey string, tag uint64) consumer.BrokerInfo {
	d := c.last.Load()
	if d == nil || d.exchange != exchange || d.routingKey != routingKey {
		dest := c.queue
		if routingKey != "" && routingKey != c.queue {
			dest = routingKey + ":" + dest
		}
		if exchange != "" {
			dest = exchange + ":" + dest
		}
		d = &destAttrs{exchange: exchange, routingKey: routingKey,
			attrs: []consumer.BrokerAttr{consumer.StringAttr(attrDestination, dest)}}
		if routingKey != "" {
			d.attrs = append(d.attrs, consumer.StringAttr(attrRoutingKey, routingKey))
		}
		c.last.Store(d)
	}
	b := c.base
	b.Attrs = d.attrs
	if tag > 0 {
		b.MessageAttrs = []consumer.BrokerAttr{consumer.IntAttr(attrDeliveryTag, int64(tag))}
	}
	return b
}
