package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sinks/webhook"
)

// Inside a Runner the sink takes the key from consumer.IdempotencyKey(ctx); here,
// outside one, the request names it. A receiver that is busy with the same
// key answers 409 and the runner retries later, with the same key.
func ExampleSink_Send() {
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("received Idempotency-Key:", r.Header.Get("Idempotency-Key"))
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusConflict)
	}))
	defer receiver.Close()

	sink, err := webhook.New(webhook.Config{URL: receiver.URL, Timeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	err = sink.Send(context.Background(), webhook.Request{Key: "order-42", Body: []byte(`{"order":42}`)})
	var se *webhook.StatusError
	if errors.As(err, &se) {
		fmt.Println("status:", se.StatusCode, "retryable:", se.Retryable, "after:", se.RetryAfter)
	}
	fmt.Println("dead-letter at once:", consumer.IsPermanent(err))
	// Output:
	// received Idempotency-Key: order-42
	// status: 409 retryable: true after: 2s
	// dead-letter at once: false
}

func ExampleParseRetryAfter() {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	d, _ := webhook.ParseRetryAfter("120", now)
	fmt.Println(d)
	d, _ = webhook.ParseRetryAfter("Sun, 01 Mar 2026 12:00:30 GMT", now)
	fmt.Println(d)
	// Output:
	// 2m0s
	// 30s
}
