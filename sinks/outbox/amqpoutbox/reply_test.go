package amqpoutbox_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sources/amqpsource"
)

// replySource returns an amqpsource over queue, closed when t ends.
func replySource(t testing.TB, queue string) consumer.Source {
	t.Helper()
	src, err := amqpsource.New(context.Background(), amqpsource.Config{URL: testenv.AMQPURL(t), Queue: queue, Logger: relaytest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// replyPublisher returns an amqpoutbox Publisher, closed when t ends.
func replyPublisher(t testing.TB) outbox.Publisher {
	t.Helper()
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: testenv.AMQPURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// TestHelperReplierChild is the replying worker of TestReplyAMQP. It does
// nothing when run on its own.
func TestHelperReplierChild(t *testing.T) {
	relaytest.ReplierMain(t, replySource, replyPublisher)
}

// TestReplyAMQP: requests with the reply_to and correlation_id properties
// get their replies (a queue, through the default exchange) from an
// idemq worker answering through outbox.Reply, with replier processes
// SIGKILLed between the commit and the reply; a repeated request gets the
// same reply id and body with its own correlation_id property.
func TestReplyAMQP(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; skipped with -short")
	}
	url := testenv.AMQPURL(t)
	requests, replies := runtest.UniqueName(t, "requests"), runtest.UniqueName(t, "replies")
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{requests, replies} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	brokerenv.DeleteQueuesAtCleanup(t, url, requests, replies)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	relaytest.RunReply(t, relaytest.ReplyBroker{
		Requests: requests,
		ReplyTo:  replies,
		Env:      []string{testenv.EnvAMQPURL + "=" + url},
		Send: func(t testing.TB, key, body, corr string) {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", requests, true, false, amqp.Publishing{
				MessageId: key, ReplyTo: replies, CorrelationId: corr, DeliveryMode: amqp.Persistent, Body: []byte(body),
			})
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
				t.Fatalf("request %s not confirmed: %v", key, err)
			}
		},
		Source:    replySource,
		Replies:   func(t testing.TB) consumer.Source { return replySource(t, replies) },
		Publisher: replyPublisher,
	}, 30, 5, relaytest.ReplyKills(3))
}
