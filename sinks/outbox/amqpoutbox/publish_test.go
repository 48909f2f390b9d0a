package amqpoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
)

// batchErrs returns the per-message errors of a Publish.
func batchErrs(t *testing.T, err error, n int) []error {
	t.Helper()
	if err == nil {
		return make([]error, n)
	}
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Errs) != n {
		t.Fatalf("Publish: %v, want a *outbox.BatchError of %d", err, n)
	}
	return be.Errs
}

// A batch larger than the returns buffer, all unroutable, is reported
// message by message as ErrNoDestination: the returns are read while the
// confirms are awaited, so they never block the connection.
func TestPublishManyReturns(t *testing.T) {
	url := testenv.AMQPURL(t)
	_, unbound, _ := topology(t, url)
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url, ConfirmTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs := relaytest.Messages("r", unbound, 1500, 3)
	done := make(chan error, 1)
	go func() { done <- pub.Publish(context.Background(), msgs) }()
	var perr error
	select {
	case perr = <-done:
	case <-time.After(relaytest.WaitTimeout):
		t.Fatal("Publish of 1,500 unroutable messages did not return")
	}
	for i, err := range batchErrs(t, perr, len(msgs)) {
		if !errors.Is(err, outbox.ErrNoDestination) {
			t.Fatalf("message %d: %v, want ErrNoDestination", i, err)
		}
	}
	// The Publisher still works.
	exchange, _, queue := topology(t, url)
	ok := relaytest.Messages("ok", exchange, 10, 2)
	if err := pub.Publish(context.Background(), ok); err != nil {
		t.Fatal(err)
	}
	relaytest.Check(t, ok, consumeAll(t, url, queue, len(ok)), false)
}

// An exchange deleted after its first check closes the channel at the
// next publish: that batch is an outage (no attempt counted for any of its
// messages), and the next batch checks the exchange again and reports it
// missing.
func TestPublishDeletedExchange(t *testing.T) {
	url := testenv.AMQPURL(t)
	exchange, _, _ := topology(t, url)
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx := context.Background()
	if err := pub.Publish(ctx, relaytest.Messages("a", exchange, 3, 1)); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		t.Fatal(err)
	}
	msgs := relaytest.Messages("b", exchange, 5, 1)
	for i, err := range batchErrs(t, pub.Publish(ctx, msgs), len(msgs)) {
		if !errors.Is(err, outbox.ErrUnavailable) {
			t.Fatalf("message %d after the exchange was deleted: %v, want ErrUnavailable", i, err)
		}
	}
	for i, err := range batchErrs(t, pub.Publish(ctx, msgs), len(msgs)) {
		if !errors.Is(err, outbox.ErrNoDestination) {
			t.Fatalf("message %d of the next batch: %v, want ErrNoDestination", i, err)
		}
	}
}

// Concurrent Publish calls each publish on a channel of their own; every
// message arrives once, and the messages of each call in its order.
func TestPublishConcurrent(t *testing.T) {
	url := testenv.AMQPURL(t)
	exchange, _, queue := topology(t, url)
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	const callers, batches, size = 4, 10, 50
	var want []outbox.Message
	var wg sync.WaitGroup
	errs := make(chan error, callers*batches)
	for c := range callers {
		// Each caller has keys of its own, so per-key order is its order.
		msgs := relaytest.Messages(fmt.Sprintf("c%d", c), exchange, batches*size, 1)
		for i := range msgs {
			msgs[i].Key = fmt.Sprintf("caller-%d", c)
		}
		want = append(want, msgs...)
		wg.Go(func() {
			for b := range batches {
				if err := pub.Publish(context.Background(), msgs[b*size:(b+1)*size]); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	relaytest.Check(t, want, consumeAll(t, url, queue, len(want)), false)
}
