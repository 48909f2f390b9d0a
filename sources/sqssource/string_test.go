package sqssource_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/sources/sqssource"
)

// String names the queue by its URL for the Runner's start line.
func TestSourceString(t *testing.T) {
	needServices(t)
	q := newQueue(t, queueOptions{})
	src, err := sqssource.New(testContext(t, 30*time.Second), sqsClient(t), sqssource.Config{QueueURL: q.URL, DeadLetterQueueURL: q.DLQURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	s, ok := any(src).(fmt.Stringer)
	if !ok {
		t.Fatal("*sqssource.Source has no String method")
	}
	if got, want := s.String(), "sqs "+q.URL; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
