package brokerenv

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
	deleteAtCleanup(t, url, "queue", queues, func(ch *amqp.Channel, q string) error {
		_, err := ch.QueueDelete(q, false, false, false)
		return err
	})
}

// DeleteExchangesAtCleanup deletes exchanges from the RabbitMQ broker at url
// when t and its subtests end, as DeleteQueuesAtCleanup deletes queues.
func DeleteExchangesAtCleanup(t testing.TB, url string, exchanges ...string) {
	t.Helper()
	deleteAtCleanup(t, url, "exchange", exchanges, func(ch *amqp.Channel, x string) error {
		return ch.ExchangeDelete(x, false, false)
	})
}

// deleteAtCleanup runs del for each name, on a channel of a connection of
// its own, when t ends; it logs the first failure and stops there (the
// broker closes a channel on an error).
func deleteAtCleanup(t testing.TB, url, what string, names []string, del func(*amqp.Channel, string) error) {
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Logf("delete %ss %v: %v", what, names, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Logf("delete %ss %v: %v", what, names, err)
			return
		}
		for _, n := range names {
			if err := del(ch, n); err != nil {
				t.Logf("delete %s %s: %v", what, n, err)
				return
			}
		}
	})
}
