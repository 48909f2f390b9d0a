package amqpsource

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/testenv"
)

// The acknowledgements recorded before a pass of the ack loop share one
// multiple-ack, whatever their order and the calls that recorded them; a
// multiple-ack never covers an unsettled delivery, so the settled ones
// behind it go out on their own.
func TestFlushCoalescesRecordedAcks(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ; skipped with -short")
	}
	t.Parallel()
	url := testenv.AMQPURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := "idemq.test.flush." + rand.Text()[:8]
	src, err := New(ctx, Config{URL: url, Queue: q, Prefetch: 20, Declare: &Topology{QueueType: QueueTypeClassic}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	pub, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ch, err := pub.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { // before pub closes
		_, _ = ch.QueueDelete(q, false, false, false)
		_, _ = ch.QueueDelete(q+".dlq", false, false, false)
	}()
	const n = 10
	deliver := func() []*consumer.Message {
		t.Helper()
		for i := range n {
			if err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{Body: []byte{byte(i)}}); err != nil {
				t.Fatal(err)
			}
		}
		var msgs []*consumer.Message
		for len(msgs) < n {
			got, err := src.Receive(ctx, n-len(msgs))
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, got...)
		}
		return msgs
	}
	// record marks msgs acknowledged, newest first, as separate Ack calls
	// would, while the loop cannot run, and then runs one pass.
	record := func(msgs []*consumer.Message) {
		t.Helper()
		sess := consumer.DeliveryOf(msgs[0]).Handle.(*handle).sess
		sess.ackMu.Lock()
		defer sess.ackMu.Unlock()
		for i := len(msgs) - 1; i >= 0; i-- {
			sess.settled[consumer.DeliveryOf(msgs[i]).Handle.(*handle).tag] = sess.clock()
		}
		if _, err := sess.flushLocked(0); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, acked, frames uint64) {
		t.Helper()
		if st := src.Stats(); st.Acked != acked || st.AckFrames != frames {
			t.Fatalf("%s: Acked %d, AckFrames %d; want %d and %d", what, st.Acked, st.AckFrames, acked, frames)
		}
	}

	record(deliver())
	check("all ten recorded", n, 1)

	msgs := deliver()
	record(msgs[1:])
	check("all but the oldest recorded", 2*n-1, n)
	if err := src.Ack(ctx, msgs[:1]); err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	check("the oldest acknowledged and closed", 2*n, n+1)
}
