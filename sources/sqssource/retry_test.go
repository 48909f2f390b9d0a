package sqssource_test

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/idemq/idemq/sources/sqssource"
)

// A client from NewClient waits at most MaxRetryBackoff between two attempts
// of a call, however many attempts failed: a receive retried while SQS was
// away goes on soon after it answers (the SDK's own backoff grows to 20 s).
func TestNewClientCapsRetryBackoff(t *testing.T) {
	c, err := sqssource.NewClient(context.Background(), "http://127.0.0.1:1",
		config.WithRegion("us-east-1"),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("id", "secret", "")))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Options().Retryer
	for attempt := 1; attempt <= 10; attempt++ {
		d, err := r.RetryDelay(attempt, errors.New("connection reset by peer"))
		if err != nil {
			t.Fatalf("RetryDelay(%d): %v", attempt, err)
		}
		if d > sqssource.MaxRetryBackoff {
			t.Fatalf("attempt %d waits %v, want at most %v", attempt, d, sqssource.MaxRetryBackoff)
		}
	}
}
