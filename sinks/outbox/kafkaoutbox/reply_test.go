package kafkaoutbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sources/kafkasource"
)

// replySource returns a kafkasource over topic in group, with group
// timeouts short enough for a test that kills members (the broker's
// minimum session timeout is 6 s), closed when t ends.
func replySource(t testing.TB, topic, group string) consumer.Source {
	t.Helper()
	src, err := kafkasource.New(context.Background(), kafkasource.Config{
		Brokers:           testenv.KafkaBrokers(t),
		Topics:            []string{topic},
		GroupID:           group,
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: 300 * time.Millisecond,
		RebalanceTimeout:  10 * time.Second,
		JoinGroupBackoff:  200 * time.Millisecond,
		MaxWait:           250 * time.Millisecond,
		CommitInterval:    100 * time.Millisecond,
		Logger:            relaytest.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// requestSource is the replier's source: the requests topic in the group
// named after it.
func requestSource(t testing.TB, requests string) consumer.Source {
	return replySource(t, requests, requests+"-replier")
}

// TestHelperReplierChild is the replying worker of TestReplyKafka. It does
// nothing when run on its own.
func TestHelperReplierChild(t *testing.T) {
	relaytest.ReplierMain(t, requestSource, func(t testing.TB) outbox.Publisher { return newPublisher(t, testenv.KafkaBrokers(t)) })
}

// TestReplyKafka: requests with the idemq-reply-to and
// idemq-correlation-id headers get their replies on the reply topic from an
// idemq worker answering through outbox.Reply, with replier processes
// SIGKILLed between the commit and the reply; a repeated request gets the
// same reply id and body with its own correlation id. Each kill costs a
// session timeout (6 s) before the next replier owns the partitions; set
// IDEMQ_REPLY_KILLS for more kills than the default 3.
func TestReplyKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; skipped with -short")
	}
	brokers := testenv.KafkaBrokers(t)
	requests, replies := newTopic(t, brokers), newTopic(t, brokers)
	// A transport of its own: the shared default one caches metadata and
	// may not know the topic created just now (UnknownTopicOrPartition).
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Transport: tr, Addr: kafka.TCP(brokers...), Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	relaytest.RunReply(t, relaytest.ReplyBroker{
		Requests: requests,
		ReplyTo:  replies,
		Env:      []string{testenv.EnvKafkaBrokers + "=" + strings.Join(brokers, ",")},
		Send: func(t testing.TB, key, body, corr string) {
			err := w.WriteMessages(context.Background(), kafka.Message{Topic: requests, Key: []byte(key), Value: []byte(body), Headers: []kafka.Header{
				{Key: outbox.HeaderIdempotencyKey, Value: []byte(key)},
				{Key: consumer.HeaderReplyTo, Value: []byte(replies)},
				{Key: consumer.HeaderCorrelationID, Value: []byte(corr)},
			}})
			if err != nil {
				t.Fatal(err)
			}
		},
		Source:    requestSource,
		Replies:   func(t testing.TB) consumer.Source { return replySource(t, replies, replies+"-requester") },
		Publisher: func(t testing.TB) outbox.Publisher { return newPublisher(t, brokers) },
	}, 30, 5, relaytest.ReplyKills(3))
}
