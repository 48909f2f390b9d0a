package testenv

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DeleteQueuesAtCleanup deletes queues from the RabbitMQ broker at url when t
// and its subtests end, so that test runs do not pile queues up on a
// long-lived broker. A queue that does not exist is fine; another failure is
// logged, not fatal.
func DeleteQueuesAtCleanup(t testing.TB, url string, queues ...string) {
	t.Helper()
	t.Cleanup(func() {
		withAMQPChannel(t, url, func(ch *amqp.Channel) error {
			for _, q := range queues {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					t.Logf("delete queue %s: %v", q, err)
					return err // the broker has closed the channel
				}
			}
			return nil
		})
	})
}

// DeleteExchangesAtCleanup deletes exchanges from the RabbitMQ broker at url
// when t and its subtests end, as DeleteQueuesAtCleanup deletes queues.
func DeleteExchangesAtCleanup(t testing.TB, url string, exchanges ...string) {
	t.Helper()
	t.Cleanup(func() {
		withAMQPChannel(t, url, func(ch *amqp.Channel) error {
			for _, x := range exchanges {
				if err := ch.ExchangeDelete(x, false, false); err != nil {
					t.Logf("delete exchange %s: %v", x, err)
					return err // the broker has closed the channel
				}
			}
			return nil
		})
	})
}

// withAMQPChannel runs f on a channel of a connection of its own, and logs
// why it could not.
func withAMQPChannel(t testing.TB, url string, f func(*amqp.Channel) error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	_ = f(ch)
}
