package sqsoutbox_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sinks/outbox/sqsoutbox"
	"github.com/idemq/idemq/sources/sqssource"
)

// TestHelperRelayChild is the relay process of TestRelayCrash. It does
// nothing when run on its own.
func TestHelperRelayChild(t *testing.T) {
	relaytest.ChildMain(t, func(t *testing.T) outbox.Publisher {
		pub, err := sqsoutbox.New(newClient(t))
		if err != nil {
			t.Fatal(err)
		}
		return pub
	})
}

// queueDepth returns the approximate number of visible messages in url.
func queueDepth(t testing.TB, c *sqs.Client, url string) int {
	t.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages},
	})
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	return n
}

// TestRelayCrash kills the relay process with SIGKILL between SQS's
// SendMessageBatch response and the row update, many times; an sqssource
// + pgdedup consumer reading the idempotency-key attribute then sees
// duplicate deliveries but applies every event once and misses none. (A
// standard queue: a FIFO queue would drop the re-sends itself by their
// deduplication id.)
func TestRelayCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; skipped with -short")
	}
	const (
		n     = 600
		keys  = 8
		batch = 7
		kills = 30
	)
	c := newClient(t)
	url := newQueue(t, c, false)
	pool, schema, dbURL := relaytest.NewPool(t)
	want := relaytest.Messages("e", url, n, keys)
	relaytest.Insert(t, pool, want)

	killed := relaytest.RunKills(t, pool, dbURL, []string{testenv.EnvSQSEndpoint + "=" + testenv.SQSEndpoint(t)}, kills, batch)
	t.Logf("%d relay processes SIGKILLed between confirm and update; %s", killed, relaytest.Describe(t, pool))
	pub, err := sqsoutbox.New(c)
	if err != nil {
		t.Fatal(err)
	}
	relaytest.StartRelays(t, pool, pub, 1, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == n
	})
	total := queueDepth(t, c, url)
	if total <= n {
		t.Fatalf("queue holds %d messages for %d events after %d kills; the test proves nothing", total, n, killed)
	}
	t.Logf("queue holds %d messages for %d events: %d duplicates from the kills", total, n, total-n)

	ctx := context.Background()
	src, err := sqssource.New(ctx, c, sqssource.Config{
		QueueURL:              url,
		DeadLetterQueueURL:    newQueue(t, c, false),
		KeyAttribute:          outbox.HeaderIdempotencyKey,
		PartitionKeyAttribute: outbox.HeaderPartitionKey,
		WaitTime:              time.Second,
		Logger:                relaytest.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	relaytest.Downstream(t, pool, schema, src, 10, total, n)
}
