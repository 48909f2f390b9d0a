package amqpsource

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
)

// RetryQueueDefaults returns the arguments every retry queue gets unless
// Config.ClassicRetryQueues is set: a quorum queue that keeps each expired
// copy until Queue has confirmed it ("x-dead-letter-strategy"
// "at-least-once", which requires "x-overflow" "reject-publish"). Each call
// returns a new map.
func RetryQueueDefaults() amqp.Table {
	return amqp.Table{
		"x-queue-type":           QueueTypeQuorum,
		"x-dead-letter-strategy": "at-least-once",
		"x-overflow":             "reject-publish",
	}
}

// retryQueueArgs returns the declaration arguments of the retry queue whose
// delay is bucket.
func (c Config) retryQueueArgs(bucket time.Duration) amqp.Table {
	args := amqp.Table{}
	if !c.ClassicRetryQueues {
		maps.Copy(args, RetryQueueDefaults())
	}
	maps.Copy(args, c.RetryQueueArgs)
	args["x-message-ttl"] = bucket.Milliseconds()
	args["x-dead-letter-exchange"] = ""
	args["x-dead-letter-routing-key"] = c.Queue
	return args
}

// retryRedeclareEvery returns how often a retry queue whose delay is bucket
// is declared again while copies go into it (0: never), from the
// "x-expires" of RetryQueueArgs. RabbitMQ deletes such a queue x-expires
// after its last declaration, copies and all; declared again once
// (x-expires - bucket) / 2 has passed, it outlives every copy put in it. A
// bucket not shorter than x-expires cannot be kept safe: a *idemq.ConfigError.
func (c Config) retryRedeclareEvery(bucket time.Duration) (time.Duration, error) {
	expires, ok, err := millisArg(c.RetryQueueArgs, "x-expires")
	if !ok || err != nil { // validate reported a bad value
		return 0, nil
	}
	if expires <= bucket {
		return 0, &idemq.ConfigError{Field: "amqpsource.Config.RetryQueueArgs", Reason: fmt.Sprintf(
			"x-expires %v is not longer than the retry delay %v: the broker could delete the retry queue with the copy in it", expires, bucket)}
	}
	return max((expires-bucket)/2, time.Millisecond), nil
}

// checkBroker reports, as a *idemq.ConfigError, a broker that cannot run the
// configured retry queues: at-least-once retry queues need RabbitMQ 3.10 or
// later, the first release whose quorum queues support message TTLs and
// at-least-once dead-lettering. props are the server properties of
// connection.start.
func (c Config) checkBroker(props amqp.Table) error {
	if c.ClassicRetryQueues {
		return nil
	}
	product, _ := props["product"].(string)
	version, _ := props["version"].(string)
	var major, minor int // of "3.10.8", "4.1.0-rc.1"
	_, err := fmt.Sscanf(version, "%d.%d", &major, &minor)
	if !strings.EqualFold(product, "RabbitMQ") || err != nil || major < 3 || (major == 3 && minor < 10) {
		return &idemq.ConfigError{Field: "amqpsource.Config.ClassicRetryQueues", Reason: fmt.Sprintf(
			"the broker is %q version %q; at-least-once retry queues (quorum queues with x-message-ttl and x-dead-letter-strategy at-least-once) need RabbitMQ 3.10 or later: upgrade the broker, or set ClassicRetryQueues to accept that a retried message is lost when the broker stops while its copy expires",
			product, version)}
	}
	return nil
}

// DeadLetterReason returns why a message in the dead-letter queue was
// dead-lettered: the consumer.MetaReason header of a copy that idemq dead-lettered
// (a handler error, exhausted retries, a missing key), or, for a message the
// broker dead-lettered by itself, the broker's reason from the
// x-first-death-reason and x-first-death-queue headers, for example
// "broker: delivery_limit in queue orders" (a quorum queue's
// Topology.DeliveryLimit: the message came back unsettled that often, its
// consumers crashing or disconnecting while holding it), "broker: expired"
// or "broker: rejected". It returns "" for a message with neither.
func DeadLetterReason(headers amqp.Table) string {
	if r, ok := headers[consumer.MetaReason].(string); ok && r != "" {
		return r
	}
	r, _ := headers["x-first-death-reason"].(string)
	if r == "" {
		return ""
	}
	if q, _ := headers["x-first-death-queue"].(string); q != "" {
		return "broker: " + r + " in queue " + q
	}
	return "broker: " + r
}

// retryDeclareError wraps a refused retry queue declaration. A
// PRECONDITION_FAILED means the queue exists with other arguments, typically a
// classic retry queue declared before at-least-once retry queues became the
// default: the error says how to get out.
func retryDeclareError(queue string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		return fmt.Errorf("amqpsource: declare retry queue %q: it exists with other arguments (a classic retry queue from an older configuration?): delete it once it is empty, or set Config.ClassicRetryQueues / RetryQueueArgs to match it: %w", queue, err)
	}
	return fmt.Errorf("amqpsource: declare retry queue %q: %w", queue, err)
}
