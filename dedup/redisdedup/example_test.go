package redisdedup_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisdedup"
)

// The store plugs into the lease path of a Runner. Any UniversalClient works:
// redis.NewFailoverClient for Sentinel, redis.NewClusterClient for a Cluster.
func Example() {
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:6379"}})
	defer rdb.Close()
	store, err := redisdedup.New(rdb, redisdedup.Config{Prefix: "billing:"})
	if err != nil {
		log.Fatal(err)
	}
	handler := func(ctx context.Context, msg *consumer.Message) error {
		key, _ := consumer.DedupKey(ctx) // send it downstream as the idempotency key
		_ = key
		return nil
	}
	_ = consumer.Leased(store, handler, consumer.LeaseOptions{Lease: 30 * time.Second})
}

// Using the store directly: claim, run the effect, mark it done, or release
// the claim when the effect failed.
func ExampleStore_Claim() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	store, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		log.Fatal(err)
	}

	rec := dedup.Record{Key: "invoice-42", PayloadHash: dedup.HashPayload([]byte(`{"amount":1200}`))}
	token := "attempt-7f3a" // unique per attempt
	c, err := store.Claim(ctx, "mailer", rec, token, 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	switch c.State {
	case dedup.StateNew:
		if err := sendInvoice(ctx); err != nil {
			_ = store.Abandon(ctx, "mailer", rec.Key, token) // the retry may claim at once
			return
		}
		err := store.Complete(ctx, "mailer", rec.Key, token, 72*time.Hour)
		if errors.Is(err, dedup.ErrLeaseLost) {
			log.Print("lease expired while sending: another worker may send it again")
		}
	case dedup.StateDone:
		// Sent before: nothing to do.
	case dedup.StateInProgress:
		// Another worker is sending it right now: try again later.
	case dedup.StateMismatch:
		// Same key, different invoice: poison.
	}
}

func sendInvoice(context.Context) error { return nil }
