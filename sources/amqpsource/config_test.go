package amqpsource_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/sources/amqpsource"
)

// TestConfigErrorsNameEveryField: New reports every bad field at once, each a
// *idemq.ConfigError matching
// idemq.ErrInvalidConfig, before it dials.
func TestConfigErrorsNameEveryField(t *testing.T) {
	cases := []struct {
		name string
		cfg  amqpsource.Config
		want []string
	}{
		{"url and queue", amqpsource.Config{},
			[]string{"amqpsource.Config.URL", "amqpsource.Config.Queue"}},
		{"recovery, prefetch and retry args", amqpsource.Config{URL: "amqp://127.0.0.1:1", Queue: "q",
			AMQP: amqp.Config{Recovery: &amqp.Recovery{}}, Prefetch: 70000, PublishTimeout: -time.Second,
			RetryQueueArgs: amqp.Table{"x-queue-type": "classic"}},
			[]string{"amqpsource.Config.AMQP.Recovery", "amqpsource.Config.Prefetch", "amqpsource.Config.PublishTimeout", "amqpsource.Config.RetryQueueArgs"}},
	}
	for _, tc := range cases {
		src, err := amqpsource.New(context.Background(), tc.cfg)
		if err == nil {
			_ = src.Close()
		}
		if !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want idemq.ErrInvalidConfig", tc.name, err)
		}
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: New = %v, want a *idemq.ConfigError", tc.name, err)
		}
		if got := cfgerr.Fields(err); !slices.Equal(got, tc.want) {
			t.Errorf("%s: New = %v, reports fields %q, want %q", tc.name, err, got, tc.want)
		}
	}
}

// TestDeadLetterMetadataNames: the dead-letter headers are the names defined
// once in consumer.
func TestDeadLetterMetadataNames(t *testing.T) {
	for got, want := range map[string]string{
		consumer.MetaReason:         consumer.MetaReason,
		consumer.MetaAttempts:       consumer.MetaAttempts,
		consumer.MetaKey:            consumer.MetaKey,
		consumer.MetaDeadLetteredAt: consumer.MetaDeadLetteredAt,
	} {
		if got != want {
			t.Errorf("header %q, want %q", got, want)
		}
	}
}

// QueueNames lists the queue, the dead-letter queue the configuration names
// and the retry queues of its prefix.
func TestQueueNames(t *testing.T) {
	for _, tc := range []struct {
		cfg       amqpsource.Config
		head      []string
		retryFrom string
	}{
		{amqpsource.Config{Queue: "orders"}, []string{"orders", "orders.dlq"}, "orders.retry."},
		{amqpsource.Config{Queue: "orders", DeadLetterRoutingKey: "orders-dead", RetryQueuePrefix: "delay.orders."},
			[]string{"orders", "orders-dead"}, "delay.orders."},
	} {
		want := append(tc.head, amqpsource.RetryQueueNames(tc.retryFrom)...)
		if got := amqpsource.QueueNames(tc.cfg); !slices.Equal(got, want) {
			t.Errorf("QueueNames(%+v) = %v, want %v", tc.cfg, got, want)
		}
	}
}
