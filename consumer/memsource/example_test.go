package memsource_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/consumer/memsource"
)

// A lost acknowledgement ("the worker crashed after its commit, before its
// ack") makes the broker deliver the message again once its visibility
// timeout passes, with the same ID and a higher Attempt.
func Example() {
	b := memsource.New(memsource.Config{VisibilityTimeout: 50 * time.Millisecond})
	defer b.Close()
	b.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Key: "order-1"})
	ids := b.Publish("orders", memsource.Outgoing{Key: "order-1", Body: []byte(`{"amount":42}`)})

	src := b.Source("orders")
	ctx := context.Background()
	for range 2 {
		msgs, err := src.Receive(ctx, 10)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, m := range msgs {
			fmt.Printf("%s attempt %d redelivered=%v same-id=%v\n", m.Key, m.Attempt, m.Redelivered, m.ID == ids[0])
		}
		if err := src.Ack(ctx, msgs); err != nil {
			fmt.Println(err)
			return
		}
	}
	st := b.Stats("orders")
	fmt.Printf("deliveries=%d acks=%d dropped=%d pending=%d\n", st.Deliveries, st.Acks, st.DroppedAcks, st.Pending)
	// Output:
	// order-1 attempt 1 redelivered=false same-id=true
	// order-1 attempt 2 redelivered=true same-id=true
	// deliveries=2 acks=1 dropped=1 pending=0
}

// Faults can be scripted by probability; the broker's seeded RNG makes a
// given sequence of calls fail the same way on every run.
func ExampleBroker_Inject() {
	b := memsource.New(memsource.Config{Seed: 1})
	defer b.Close()
	// Every message is delivered twice in a row, as after a redelivery.
	b.Inject(memsource.Fault{Kind: memsource.Redelivered, Times: -1})
	// A third of receives fail as if the broker were unreachable.
	b.Inject(memsource.Fault{Kind: memsource.ReceiveError, Probability: 0.3, Times: -1})
	b.Publish("events", memsource.Outgoing{Key: "e-1"}, memsource.Outgoing{Key: "e-2"})

	src := b.Source("events")
	ctx := context.Background()
	for delivered := 0; delivered < 4; {
		msgs, err := src.Receive(ctx, 10)
		if err != nil {
			continue // the Runner retries receive errors with backoff
		}
		for _, m := range msgs {
			fmt.Println(m.Key, m.Attempt)
		}
		delivered += len(msgs)
		_ = src.Ack(ctx, msgs)
	}
	// Output:
	// e-1 1
	// e-1 2
	// e-2 1
	// e-2 2
}
