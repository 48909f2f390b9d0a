package redisdedup_test

import (
	"context"
	"encoding/json"
	"log"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/sinks/webhook"
)

// Welcome is the body of a welcome-email message.
type Welcome struct {
	Email string `json:"email"`
	Name  string `json:"name"`
}

// A worker whose effect is outside any database (an email vendor's HTTP API)
// uses the lease path: a Redis lease per message key, the webhook sink to
// send the effect with the key as Idempotency-Key, and acknowledgement only
// after the key is marked done.
func Example_webhook() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	store, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		log.Fatal(err)
	}
	mail, err := webhook.New(webhook.Config{
		URL:    "https://mail.example.com/v1/send",
		Header: http.Header{"Authorization": {"Bearer <api key>"}},
	})
	if err != nil {
		log.Fatal(err)
	}

	// The handler builds the vendor's request; the sink adds the message's
	// key (consumer.DedupKey) as Idempotency-Key, the same on every attempt.
	send := consumer.JSON(func(ctx context.Context, _ *consumer.Message, w Welcome) error {
		body, err := json.Marshal(map[string]string{"to": w.Email, "template": "welcome", "name": w.Name})
		if err != nil {
			return consumer.Permanent(err)
		}
		return mail.Send(ctx, webhook.Request{Body: body})
	})

	broker := memsource.New(memsource.Config{}) // a real worker uses amqpsource, sqssource or kafkasource
	defer broker.Close()
	src := broker.Source("signups")
	defer src.Close()

	r, err := consumer.NewRunner(src, consumer.Leased(store, send, consumer.LeaseOptions{
		Lease: 30 * time.Second, // a crashed worker holds a key this long
	}), consumer.Config{Name: "welcome-mail"})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
