package amqpsource

import (
	"context"
	"fmt"
	"reflect"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
)

var _ consumer.HorizonReporter = (*Source)(nil)

// RedeliveryHorizon returns the message TTL of Queue as Config.Declare
// declares it (Topology.MessageTTL, or x-message-ttl in Topology.QueueArgs),
// else consumer.Unbounded: a RabbitMQ queue without a message TTL keeps an
// unsettled message for ever. The Source cannot read the arguments of a
// queue it did not declare (AMQP 0.9.1 does not return them, and a policy
// may set a TTL too): for a queue declared by operations (Declare nil) it
// returns an error matching consumer.ErrHorizonUnknown (see
// consumer.HorizonReporter for what the Runner does). The retry queues' TTLs do not count: a message only enters one after its
// handler failed, which left no record.
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, error) {
	if s.cfg.Declare == nil {
		return 0, fmt.Errorf("amqpsource: queue %q is not declared by the source (Config.Declare is nil), so its message TTL cannot be read: declare it with Topology.MessageTTL at most the dedup retention: %w",
			s.cfg.Queue, consumer.ErrHorizonUnknown)
	}
	if ttl := s.cfg.Declare.MessageTTL; ttl > 0 {
		return ttl, nil
	}
	ttl, ok, err := millisArg(s.cfg.Declare.QueueArgs, "x-message-ttl")
	if err != nil {
		return 0, fmt.Errorf("amqpsource: queue %q: %w", s.cfg.Queue, err)
	}
	if !ok {
		return consumer.Unbounded, nil
	}
	return ttl, nil
}

// millisArg returns the queue argument name of args, a number of
// milliseconds, as a duration; ok is false when args does not have it, and
// err is not nil when it is not an integer.
func millisArg(args amqp.Table, name string) (d time.Duration, ok bool, err error) {
	v, ok := args[name]
	if !ok {
		return 0, false, nil
	}
	var ms int64
	switch n := v.(type) {
	case int, int32, int64:
		ms = reflect.ValueOf(n).Int()
	case uint32:
		ms = int64(n)
	default:
		return 0, true, fmt.Errorf("%s %v (%T) is not an integer", name, v, v)
	}
	return time.Duration(ms) * time.Millisecond, true, nil
}
