package amqpsource_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/amqpsource"
)

// holdLong is an AckHold far longer than ackedOnce waits (backTimeout): what
// it holds is sent in time only by a multiple-ack, past the count bound or
// by Close.
const holdLong = amqpsource.MaxAckHold

// ackedOnce waits (at most backTimeout, well within holdLong) until src has
// acknowledged acked deliveries and checks the frames it took.
func ackedOnce(t *testing.T, src *amqpsource.Source, acked, frames uint64) {
	t.Helper()
	stats := func() string { st := src.Stats(); return fmt.Sprintf("Acked %d in %d frames", st.Acked, st.AckFrames) }
	runtest.WaitFor(t, min(backTimeout, holdLong/2), stats, func() bool { return src.Stats().Acked >= acked })
	if st := src.Stats(); st.Acked != acked || st.AckFrames != frames {
		t.Fatalf("%s, want %d in %d frames", stats(), acked, frames)
	}
}

// holdSetup publishes n messages to a new classic queue and receives them
// all with a source of the given prefetch and AckHold.
func holdSetup(t *testing.T, n, prefetch int, hold time.Duration) (string, *amqpsource.Source, []*consumer.Message) {
	t.Helper()
	url := brokerURL(t)
	q := newQueue(t, url, classic, 0)
	publish(t, url, q, outgoing("hold", n)...)
	src := newSource(t, amqpsource.Config{URL: url, Queue: q, Prefetch: prefetch, AckHold: hold})
	return q, src, receive(t, src, n, testTimeout)
}

// Deliveries settled behind one still being handled wait for it, and one
// multiple-ack then covers them all.
func TestAckHoldCoalescesBehindUnsettled(t *testing.T) {
	t.Parallel()
	_, src, msgs := holdSetup(t, 10, 20, holdLong)
	ctx := context.Background()
	for _, m := range msgs[1:] { // one Ack call each, as lanes would
		if err := src.Ack(ctx, []*consumer.Message{m}); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	// Give the ack loop time for passes that must send nothing (should
	// the machine be slower, the test only proves less).
	time.Sleep(100 * time.Millisecond)
	if st := src.Stats(); st.Acked != 0 {
		t.Fatalf("%d acknowledged while the oldest delivery is unsettled, want 0", st.Acked)
	}
	if err := src.Ack(ctx, msgs[:1]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	ackedOnce(t, src, 10, 1)
}

// Past AckHold, a settled delivery behind an unsettled one is acknowledged
// on its own, so that it does not keep its prefetch slot.
func TestAckHoldEnds(t *testing.T) {
	t.Parallel()
	_, src, msgs := holdSetup(t, 10, 20, 50*time.Millisecond)
	if err := src.Ack(context.Background(), msgs[1:]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	ackedOnce(t, src, 9, 9)
}

// More than half the prefetch never waits: a slow delivery ahead keeps at
// most half of the slots. The unsettled delivery is not covered.
func TestSettledBehindUnsettledIsAcked(t *testing.T) {
	t.Parallel()
	q, src, msgs := holdSetup(t, 3, 3, holdLong) // half of 3 is 1
	if err := src.Ack(context.Background(), msgs[1:]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	ackedOnce(t, src, 2, 2)
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	expectOnly(t, q, msgs[0])
}

// Close sends the acknowledgements that wait for a multiple-ack: only the
// unsettled delivery comes back.
func TestCloseSendsHeldAcks(t *testing.T) {
	t.Parallel()
	q, src, msgs := holdSetup(t, 10, 20, holdLong)
	if err := src.Ack(context.Background(), msgs[1:]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if st := src.Stats(); st.Acked != 9 {
		t.Fatalf("Close sent %d acknowledgements, want the 9 held", st.Acked)
	}
	expectOnly(t, q, msgs[0])
}

// Retry and DeadLetter acknowledge the original at once, even behind an
// unsettled delivery: its copy is out, and a crash before the
// acknowledgement would bring back both. What was held goes out with it.
func TestCopiedOriginalIsNotHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, copyOut := range map[string]func(*amqpsource.Source, *consumer.Message) error{
		"retry": func(src *amqpsource.Source, m *consumer.Message) error { return src.Retry(ctx, m, time.Minute) },
		"dead letter": func(src *amqpsource.Source, m *consumer.Message) error {
			return src.DeadLetter(ctx, m, errors.New("poison"))
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, src, msgs := holdSetup(t, 3, 20, holdLong)
			if err := src.Ack(ctx, msgs[1:2]); err != nil {
				t.Fatalf("Ack: %v", err)
			}
			time.Sleep(100 * time.Millisecond) // as in TestAckHoldCoalescesBehindUnsettled
			if st := src.Stats(); st.Acked != 0 {
				t.Fatalf("%d acknowledged while the oldest delivery is unsettled, want 0", st.Acked)
			}
			if err := copyOut(src, msgs[2]); err != nil {
				t.Fatal(err)
			}
			ackedOnce(t, src, 2, 2) // the oldest is still unsettled
		})
	}
}

// expectOnly checks that q holds exactly the message of want's key.
func expectOnly(t *testing.T, q string, want *consumer.Message) {
	t.Helper()
	next := newSource(t, amqpsource.Config{URL: brokerURL(t), Queue: q})
	back := receive(t, next, 1, backTimeout)
	if got := sortedKeys(back); !slices.Equal(got, []string{want.Key}) {
		t.Fatalf("queue holds %v, want the unsettled %v", got, want.Key)
	}
	if err := next.Ack(context.Background(), back); err != nil {
		t.Fatal(err)
	}
	runtest.ExpectNothing(t, next, 300*time.Millisecond)
}
