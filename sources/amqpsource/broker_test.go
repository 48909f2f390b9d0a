package amqpsource

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
)

// A broker that cannot run at-least-once retry queues is refused with a
// *idemq.ConfigError naming the way out, unless ClassicRetryQueues opts out.
func TestCheckBroker(t *testing.T) {
	cases := []struct {
		product, version string
		ok               bool
	}{
		{"RabbitMQ", "3.10.8", true},
		{"RabbitMQ", "3.10.0", true},
		{"RabbitMQ", "3.13.7", true},
		{"RabbitMQ", "4.1.0-rc.1", true},
		{"RabbitMQ", "3.9.29", false},
		{"RabbitMQ", "3.8.35", false},
		{"RabbitMQ", "2.8", false},
		{"RabbitMQ", "", false},
		{"LavinMQ", "2.0.0", false},
		{"", "", false},
	}
	for _, c := range cases {
		props := amqp.Table{"product": c.product, "version": c.version}
		err := Config{Queue: "q"}.checkBroker(props)
		if c.ok {
			if err != nil {
				t.Errorf("%s %s: %v, want no error", c.product, c.version, err)
			}
			continue
		}
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != "amqpsource.Config.ClassicRetryQueues" || !errors.Is(err, idemq.ErrInvalidConfig) ||
			!strings.Contains(err.Error(), c.version) || !strings.Contains(err.Error(), "3.10") {
			t.Errorf("%s %s: %v, want a ClassicRetryQueues *idemq.ConfigError naming the version", c.product, c.version, err)
		}
		if err := (Config{Queue: "q", ClassicRetryQueues: true}).checkBroker(props); err != nil {
			t.Errorf("%s %s with ClassicRetryQueues: %v, want no error", c.product, c.version, err)
		}
	}
}

func TestRetryQueueArgs(t *testing.T) {
	c := Config{Queue: "orders", RetryQueueArgs: amqp.Table{"x-max-length": int64(10), "x-message-ttl": int64(1)}}
	got := c.retryQueueArgs(2_000_000_000)
	want := amqp.Table{
		"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
		"x-max-length": int64(10), "x-message-ttl": int64(2000),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders",
	}
	if len(got) != len(want) {
		t.Fatalf("retryQueueArgs = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("retryQueueArgs[%s] = %v, want %v", k, got[k], v)
		}
	}
	c.ClassicRetryQueues = true
	if got := c.retryQueueArgs(100_000_000); got["x-queue-type"] != nil || got["x-dead-letter-strategy"] != nil {
		t.Errorf("classic retryQueueArgs = %v", got)
	}
}

func TestDeadLetterReason(t *testing.T) {
	for _, c := range []struct {
		h    amqp.Table
		want string
	}{
		{amqp.Table{consumer.MetaReason: "idemq: retries exhausted", "x-first-death-reason": "expired"}, "idemq: retries exhausted"},
		{amqp.Table{"x-first-death-reason": "delivery_limit", "x-first-death-queue": "orders"}, "broker: delivery_limit in queue orders"},
		{amqp.Table{"x-first-death-reason": "rejected"}, "broker: rejected"},
		{amqp.Table{}, ""},
		{nil, ""},
	} {
		if got := DeadLetterReason(c.h); got != c.want {
			t.Errorf("DeadLetterReason(%v) = %q, want %q", c.h, got, c.want)
		}
	}
}

// With x-expires, a retry queue is declared again often enough that a copy
// put in just before the next declaration is due still leaves before the
// queue expires; a delay as long as x-expires is refused.
func TestRetryRedeclareEvery(t *testing.T) {
	cases := []struct {
		args   amqp.Table
		bucket time.Duration
		every  time.Duration
		err    bool
	}{
		{nil, time.Second, 0, false},
		{amqp.Table{"x-max-length": int64(10)}, time.Second, 0, false},
		{amqp.Table{"x-expires": int32(60_000)}, time.Second, 29500 * time.Millisecond, false},
		{amqp.Table{"x-expires": int64(60_000)}, 30 * time.Second, 15 * time.Second, false},
		{amqp.Table{"x-expires": 3000}, 2999 * time.Millisecond, time.Millisecond, false},
		{amqp.Table{"x-expires": int32(60_000)}, time.Minute, 0, true},
		{amqp.Table{"x-expires": int32(60_000)}, time.Hour, 0, true},
	}
	for _, c := range cases {
		every, err := Config{Queue: "q", RetryQueueArgs: c.args, ClassicRetryQueues: true}.retryRedeclareEvery(c.bucket)
		var ce *idemq.ConfigError
		if c.err != (errors.As(err, &ce) && ce.Field == "amqpsource.Config.RetryQueueArgs") || every != c.every {
			t.Errorf("%v, delay %v: every %v, error %v; want every %v, error %v", c.args, c.bucket, every, err, c.every, c.err)
		}
	}
	// validate refuses an x-expires that is not a positive integer, and
	// any x-expires on at-least-once retry queues.
	for _, v := range []any{"60s", int64(0), int32(-1)} {
		err := Config{Queue: "q", RetryQueueArgs: amqp.Table{"x-expires": v}, ClassicRetryQueues: true}.WithDefaults().validate()
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "x-expires") {
			t.Errorf("validate with x-expires %v = %v, want a RetryQueueArgs *idemq.ConfigError", v, err)
		}
	}
	err := Config{Queue: "q", RetryQueueArgs: amqp.Table{"x-expires": int32(60_000)}}.WithDefaults().validate()
	var ce *idemq.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "x-expires") {
		t.Errorf("validate with x-expires on at-least-once retry queues = %v, want a RetryQueueArgs *idemq.ConfigError", err)
	}
	if err := (Config{URL: "amqp://127.0.0.1:1/", Queue: "q", RetryQueueArgs: amqp.Table{"x-expires": int32(60_000)}, ClassicRetryQueues: true}).WithDefaults().validate(); err != nil {
		t.Errorf("validate with x-expires on classic retry queues = %v, want nil", err)
	}
}
