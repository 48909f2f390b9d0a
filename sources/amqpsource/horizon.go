package amqpsource

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/consumer"
)

var _ consumer.HorizonReporter = (*Source)(nil)

// RedeliveryHorizon returns the x-message-ttl of Queue as Config.Declare
// declares it (Topology.QueueArgs), else consumer.Unbounded: a RabbitMQ queue
// without a message TTL keeps an unsettled message for ever, so a redelivery
// may come at any age. The Source cannot read the arguments of a queue it
// did not declare (AMQP 0.9.1 does not return them, and a policy may set a
// TTL too), so a queue declared by operations reports Unbounded. The Runner
// warns about an unbounded horizon and refuses a TTL longer than the dedup
// store's retention (see consumer.HorizonReporter). The retry queues' TTLs do
// not count: a message only enters one after its handler failed, which left
// no record.
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, error) {
	if s.cfg.Declare == nil {
		return consumer.Unbounded, nil
	}
	v, ok := s.cfg.Declare.QueueArgs["x-message-ttl"]
	if !ok {
		return consumer.Unbounded, nil
	}
	var ms int64
	switch n := v.(type) {
	case int:
		ms = int64(n)
	case int32:
		ms = int64(n)
	case int64:
		ms = n
	case uint32:
		ms = int64(n)
	default:
		return 0, fmt.Errorf("amqpsource: queue %q: x-message-ttl %v (%T) is not an integer", s.cfg.Queue, v, v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
