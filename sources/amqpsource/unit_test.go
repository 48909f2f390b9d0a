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

func TestRetryBucketNeverEarly(t *testing.T) {
	cases := []struct {
		in, want time.Duration
		name     string
	}{
		{-time.Second, 100 * time.Millisecond, "100ms"},
		{0, 100 * time.Millisecond, "100ms"},
		{100 * time.Millisecond, 100 * time.Millisecond, "100ms"},
		{101 * time.Millisecond, 200 * time.Millisecond, "200ms"},
		{750 * time.Millisecond, time.Second, "1s"},
		{3 * time.Second, 5 * time.Second, "5s"},
		{45 * time.Second, time.Minute, "1m"},
		{time.Hour, time.Hour, "1h"},
		{time.Hour + time.Nanosecond, 2 * time.Hour, "2h"},
		{1000 * time.Hour, 1000 * time.Hour, "1000h"},
		{100000 * time.Hour, 1193 * time.Hour, "1193h"}, // capped below the broker's TTL limit
	}
	for _, c := range cases {
		got := retryBucket(c.in)
		if got != c.want || bucketName(got) != c.name {
			t.Errorf("retryBucket(%s) = %s (%q), want %s (%q)", c.in, got, bucketName(got), c.want, c.name)
		}
		if c.in <= maxTTL && got < c.in {
			t.Errorf("retryBucket(%s) = %s is earlier than asked", c.in, got)
		}
		if got > maxTTL {
			t.Errorf("retryBucket(%s) = %s exceeds the broker's TTL limit", c.in, got)
		}
	}
}

func TestHeaderConversion(t *testing.T) {
	h := stringHeaders(amqp.Table{
		"s": "x", "b": []byte("y"), "i": int32(7), "l": int64(-3), "t": true,
		"x-death": []any{amqp.Table{"count": int64(1)}},
	})
	want := map[string]string{"s": "x", "b": "y", "i": "7", "l": "-3", "t": "true"}
	if len(h) != len(want) {
		t.Fatalf("stringHeaders = %v, want %v", h, want)
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("header %s = %q, want %q", k, h[k], v)
		}
	}
	for _, v := range []any{int8(2), int16(2), int32(2), int64(2), int(2), uint8(2), uint16(2), uint32(2), uint64(2), "2", []byte("2")} {
		if n, ok := intHeader(v); !ok || n != 2 {
			t.Errorf("intHeader(%T) = %d, %v", v, n, ok)
		}
	}
	if _, ok := intHeader("two"); ok {
		t.Error(`intHeader("two") succeeded`)
	}
}

func TestCopyOfDropsPerCopyState(t *testing.T) {
	d := amqp.Delivery{
		Headers:      amqp.Table{"x-delivery-count": int64(3), "k": "v"},
		MessageId:    "m1",
		UserId:       "someone",
		Expiration:   "1000",
		DeliveryMode: amqp.Transient,
		Body:         []byte("b"),
	}
	p := copyOf(d)
	if _, ok := p.Headers["x-delivery-count"]; ok {
		t.Error("copy kept x-delivery-count")
	}
	if p.Headers["k"] != "v" || p.MessageId != "m1" || string(p.Body) != "b" {
		t.Errorf("copy lost properties: %+v", p)
	}
	if p.UserId != "" || p.Expiration != "" || p.DeliveryMode != amqp.Persistent {
		t.Errorf("copy: user-id %q expiration %q mode %d, want empty, empty, persistent", p.UserId, p.Expiration, p.DeliveryMode)
	}
	p.Headers["new"] = 1
	if _, ok := d.Headers["new"]; ok {
		t.Error("copy shares the delivery's header table")
	}
}

func TestConfigValidation(t *testing.T) {
	ok := Config{URL: "amqp://x", Queue: "q"}
	if err := ok.WithDefaults().validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	bad := map[string]Config{
		"URL":                  {Queue: "q"},
		"Queue":                {URL: "amqp://x"},
		"AMQP.Recovery":        {URL: "amqp://x", Queue: "q", AMQP: amqp.Config{Recovery: &amqp.Recovery{}}},
		"Prefetch":             {URL: "amqp://x", Queue: "q", Prefetch: -1},
		"AckHold":              {URL: "amqp://x", Queue: "q", AckHold: MaxAckHold + time.Millisecond},
		"MaxReconnectDelay":    {URL: "amqp://x", Queue: "q", ReconnectDelay: time.Minute, MaxReconnectDelay: time.Second},
		"DeadLetterRoutingKey": {URL: "amqp://x", Queue: "q", DeadLetterRoutingKey: "q"},
		"Declare.QueueType":    {URL: "amqp://x", Queue: "q", Declare: &Topology{QueueType: "stream"}},
		"Declare.BindingKeys":  {URL: "amqp://x", Queue: "q", Declare: &Topology{BindingKeys: []string{"k"}}},
		"Declare.MessageTTL":   {URL: "amqp://x", Queue: "q", Declare: &Topology{MessageTTL: -time.Second}},
	}
	both := Config{URL: "amqp://x", Queue: "q", Declare: &Topology{MessageTTL: time.Hour, QueueArgs: amqp.Table{"x-message-ttl": int64(1000)}}}
	if err := both.WithDefaults().validate(); err == nil || !strings.Contains(err.Error(), "Declare.MessageTTL") {
		t.Errorf("MessageTTL with x-message-ttl in QueueArgs: got %v, want an error for Declare.MessageTTL", err)
	}
	for field, c := range bad {
		err := c.WithDefaults().validate()
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != "amqpsource.Config."+field || !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("config with bad %s: got %v, want a *idemq.ConfigError for that field", field, err)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{URL: "amqp://x", Queue: "orders", Declare: &Topology{Exchange: "ex"}}.WithDefaults()
	switch {
	case c.Prefetch != 800: // PrefetchFor the runner's defaults: 2 × 4 lanes × 100
		t.Errorf("Prefetch = %d, want 800", c.Prefetch)
	case c.AckHold != DefaultAckHold:
		t.Errorf("AckHold = %v, want %v", c.AckHold, DefaultAckHold)
	case c.KeyHeader != DefaultKeyHeader:
		t.Errorf("KeyHeader = %q", c.KeyHeader)
	case c.RetryQueuePrefix != "orders.retry.":
		t.Errorf("RetryQueuePrefix = %q", c.RetryQueuePrefix)
	case c.DeadLetterRoutingKey != "orders.dlq":
		t.Errorf("DeadLetterRoutingKey = %q", c.DeadLetterRoutingKey)
	case c.Declare.QueueType != QueueTypeQuorum || c.Declare.DeliveryLimit != DefaultDeliveryLimit:
		t.Errorf("Declare = %+v", *c.Declare)
	case len(c.Declare.BindingKeys) != 1 || c.Declare.BindingKeys[0] != "orders":
		t.Errorf("BindingKeys = %v", c.Declare.BindingKeys)
	}
	if got := PrefetchFor(consumer.Config{Concurrency: 4, BatchSize: 100}); got != 800 {
		t.Errorf("PrefetchFor(4, 100) = %d, want 800", got)
	}
}
