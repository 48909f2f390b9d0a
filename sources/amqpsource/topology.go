package amqpsource

import (
	"fmt"
	"maps"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DeadLetterQueue returns the name of the dead-letter queue that
// Config.Declare declares: DeadLetterRoutingKey when dead letters go through
// the default exchange, else Queue + ".dlq" (bound to DeadLetterExchange with
// DeadLetterRoutingKey). cfg need not have defaults applied.
func DeadLetterQueue(cfg Config) string {
	cfg = cfg.WithDefaults()
	if cfg.DeadLetterExchange == "" {
		return cfg.DeadLetterRoutingKey
	}
	return cfg.Queue + ".dlq"
}

// QueueNames returns the queues a source of cfg may declare: Queue, its
// dead-letter queue (DeadLetterQueue) and its retry queues (RetryQueueNames
// of RetryQueuePrefix). They outlive the source; delete them when the
// consumer is retired. cfg need not have defaults applied.
func QueueNames(cfg Config) []string {
	cfg = cfg.WithDefaults()
	return append([]string{cfg.Queue, DeadLetterQueue(cfg)}, RetryQueueNames(cfg.RetryQueuePrefix)...)
}

// declareTopology declares cfg.Declare on ch: the dead-letter destination,
// the queue (with its dead-letter arguments, so that messages the broker
// dead-letters by itself, for example over a quorum queue's delivery limit,
// land there too), and the exchange with its bindings.
func declareTopology(ch *amqp.Channel, cfg Config) error {
	t := cfg.Declare
	dlq := DeadLetterQueue(cfg)
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, amqp.Table{"x-queue-type": t.QueueType}); err != nil {
		return fmt.Errorf("declare dead-letter queue %q: %w", dlq, err)
	}
	if x := cfg.DeadLetterExchange; x != "" {
		if err := ch.ExchangeDeclare(x, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare dead-letter exchange %q: %w", x, err)
		}
		if err := ch.QueueBind(dlq, cfg.DeadLetterRoutingKey, x, false, nil); err != nil {
			return fmt.Errorf("bind dead-letter queue %q to %q: %w", dlq, x, err)
		}
	}

	args := amqp.Table{}
	maps.Copy(args, t.QueueArgs)
	args["x-queue-type"] = t.QueueType
	if t.MessageTTL > 0 {
		args["x-message-ttl"] = t.MessageTTL.Milliseconds()
	}
	args["x-dead-letter-exchange"] = cfg.DeadLetterExchange
	args["x-dead-letter-routing-key"] = cfg.DeadLetterRoutingKey
	if t.QueueType == QueueTypeQuorum {
		if t.DeliveryLimit > 0 {
			args["x-delivery-limit"] = int64(t.DeliveryLimit)
		}
		// What the broker dead-letters by itself (over the delivery
		// limit) stays in the queue until the dead-letter queue confirmed
		// it, unless QueueArgs chose otherwise.
		_, strategy := t.QueueArgs["x-dead-letter-strategy"]
		_, overflow := t.QueueArgs["x-overflow"]
		if !strategy && !overflow {
			args["x-dead-letter-strategy"] = "at-least-once"
			args["x-overflow"] = "reject-publish"
		}
	}
	if _, err := ch.QueueDeclare(cfg.Queue, true, false, false, false, args); err != nil {
		return fmt.Errorf("declare queue %q: %w", cfg.Queue, err)
	}

	if t.Exchange != "" {
		if err := ch.ExchangeDeclare(t.Exchange, t.ExchangeKind, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %q: %w", t.Exchange, err)
		}
		for _, k := range t.BindingKeys {
			if err := ch.QueueBind(cfg.Queue, k, t.Exchange, false, nil); err != nil {
				return fmt.Errorf("bind queue %q to %q with key %q: %w", cfg.Queue, t.Exchange, k, err)
			}
		}
	}
	return nil
}
