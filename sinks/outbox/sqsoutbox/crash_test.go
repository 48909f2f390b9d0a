package sqsoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
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
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (event_id text NOT NULL, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
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
	r, err := consumer.NewRunner(src, consumer.Transactional(store, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, body) VALUES ($1, $2)`, msg.Key, string(msg.Body))
		return err
	}), consumer.Config{Name: "downstream", BatchSize: 10, Logger: relaytest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	relaytest.WaitFor(t, func() string { return fmt.Sprintf("%+v", r.Stats()) }, func() bool {
		s := r.Stats()
		return s.Handled+s.Duplicates >= uint64(total)
	})
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	s := r.Stats()
	t.Logf("downstream: %d deliveries, %d handled, %d duplicates absorbed; %s", s.Handled+s.Duplicates, s.Handled, s.Duplicates, relaytest.CheckEffects(t, pool, n))
	if s.Duplicates == 0 {
		t.Fatal("the consumer absorbed no duplicate; the test proves nothing")
	}
}
