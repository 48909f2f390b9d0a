package memsource_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
)

func recv(t *testing.T, src *memsource.Source, max int) []*consumer.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	msgs, err := src.Receive(ctx, max)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return msgs
}

// expectNone fails t if src receives anything within d.
func expectNone(t *testing.T, src *memsource.Source, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	msgs, err := src.Receive(ctx, 10)
	if err == nil {
		t.Fatalf("received %d message(s) (first %q attempt %d), want none", len(msgs), msgs[0].Key, msgs[0].Attempt)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive: %v, want DeadlineExceeded", err)
	}
}

func keys(msgs []*consumer.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = fmt.Sprintf("%s#%d", m.Key, m.Attempt)
	}
	return out
}

func publish(b *memsource.Broker, topic string, keys ...string) []string {
	out := make([]memsource.Outgoing, len(keys))
	for i, k := range keys {
		out[i] = memsource.Outgoing{Key: k, Body: []byte("body-" + k)}
	}
	return b.Publish(topic, out...)
}

func TestConfigValidation(t *testing.T) {
	if err := (memsource.Config{VisibilityTimeout: -1}).Validate(); !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Fatalf("Validate: %v, want idemq.ErrInvalidConfig", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("New accepted a negative VisibilityTimeout")
		}
	}()
	memsource.New(memsource.Config{VisibilityTimeout: -1})
}

func TestDeliveryAndAck(t *testing.T) {
	b := memsource.New(memsource.Config{})
	ids := publish(b, "t", "a", "b", "c")
	src := b.Source("t")
	msgs := recv(t, src, 2)
	if got := keys(msgs); !slices.Equal(got, []string{"a#1", "b#1"}) {
		t.Fatalf("first Receive got %v", got)
	}
	m := msgs[0]
	if m.ID != ids[0] || string(m.Body) != "body-a" || m.Topic != "t" || m.Redelivered || m.ReceivedAt.IsZero() {
		t.Fatalf("message %+v", m)
	}
	if st := b.Stats("t"); st.InFlight != 2 || st.Ready != 1 || st.Pending != 3 || st.Deliveries != 2 {
		t.Fatalf("stats %+v", st)
	}
	if err := src.Ack(t.Context(), msgs); err != nil {
		t.Fatal(err)
	}
	if err := src.Ack(t.Context(), msgs); err != nil {
		t.Fatalf("second Ack of settled messages: %v, want nil", err)
	}
	if got := keys(recv(t, src, 10)); !slices.Equal(got, []string{"c#1"}) {
		t.Fatalf("second Receive got %v", got)
	}
	if st := b.Stats("t"); st.Acks != 2 || st.Pending != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestVisibilityTimeout(t *testing.T) {
	b := memsource.New(memsource.Config{VisibilityTimeout: 50 * time.Millisecond})
	publish(b, "t", "a")
	src := b.Source("t")
	first := recv(t, src, 1)[0]
	again := recv(t, src, 1)[0] // blocks until the timeout passes
	if again.ID != first.ID || again.Attempt != 2 || !again.Redelivered {
		t.Fatalf("redelivery %+v of %+v", again, first)
	}
	if err := src.Ack(t.Context(), []*consumer.Message{first}); !errors.Is(err, memsource.ErrDeliveryExpired) {
		t.Fatalf("Ack of an expired delivery: %v, want ErrDeliveryExpired", err)
	}
	if err := src.Ack(t.Context(), []*consumer.Message{again}); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats("t"); st.Expired != 1 || st.Redeliveries != 1 || st.Acks != 1 || st.Pending != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestAckAfterVisibilityPassedFails(t *testing.T) {
	b := memsource.New(memsource.Config{})
	publish(b, "t", "a")
	src := b.Source("t", memsource.WithVisibilityTimeout(20*time.Millisecond))
	m := recv(t, src, 1)[0]
	time.Sleep(40 * time.Millisecond)
	if err := src.Ack(t.Context(), []*consumer.Message{m}); !errors.Is(err, memsource.ErrDeliveryExpired) {
		t.Fatalf("Ack after the visibility timeout: %v, want ErrDeliveryExpired", err)
	}
	if got := recv(t, src, 1)[0]; got.Attempt != 2 {
		t.Fatalf("redelivery attempt %d, want 2", got.Attempt)
	}
}

func TestRetryDelayAndDeadLetter(t *testing.T) {
	b := memsource.New(memsource.Config{})
	publish(b, "t", "a", "b")
	src := b.Source("t")
	msgs := recv(t, src, 2)
	if err := src.Retry(t.Context(), msgs[0], 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	reason := &consumer.DeadLetterError{Key: "b", Attempts: 1, Err: consumer.ErrMalformed}
	if err := src.DeadLetter(t.Context(), msgs[1], reason); err != nil {
		t.Fatal(err)
	}
	expectNone(t, src, 50*time.Millisecond)
	again := recv(t, src, 10)
	if got := keys(again); !slices.Equal(got, []string{"a#2"}) {
		t.Fatalf("after the retry delay got %v", got)
	}
	dl := b.DeadLetters("t")
	if len(dl) != 1 || dl[0].Key != "b" || dl[0].Attempts != 1 || !errors.Is(dl[0].Err, consumer.ErrMalformed) || dl[0].Reason != reason.Error() {
		t.Fatalf("dead letters %+v", dl)
	}
	if st := b.Stats("t"); st.Retries != 1 || st.DeadLettered != 1 || st.Pending != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCloseReturnsMessagesAtOnce(t *testing.T) {
	b := memsource.New(memsource.Config{}) // 30 s visibility: only Close can return them quickly
	publish(b, "t", "a", "b")
	first := b.Source("t")
	held := recv(t, first, 10)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := first.Ack(t.Context(), held); !errors.Is(err, consumer.ErrClosed) {
		t.Fatalf("Ack after Close: %v, want ErrClosed", err)
	}
	if got := keys(recv(t, b.Source("t"), 10)); !slices.Equal(got, []string{"a#2", "b#2"}) {
		t.Fatalf("after Close got %v", got)
	}
}

func TestForeignMessage(t *testing.T) {
	b := memsource.New(memsource.Config{})
	publish(b, "t", "a")
	m := recv(t, b.Source("t"), 1)[0]
	if err := b.Source("t").Ack(t.Context(), []*consumer.Message{m}); !errors.Is(err, memsource.ErrForeignMessage) {
		t.Fatalf("Ack by another source: %v, want ErrForeignMessage", err)
	}
}

func TestFaultDuplicate(t *testing.T) {
	b := memsource.New(memsource.Config{})
	b.Inject(memsource.Fault{Kind: memsource.Redelivered, Key: "a"})
	publish(b, "t", "a", "b")
	src := b.Source("t")
	msgs := recv(t, src, 10)
	if got := keys(msgs); !slices.Equal(got, []string{"a#1", "a#2", "b#1"}) {
		t.Fatalf("got %v, want a twice in a row", got)
	}
	if msgs[0].ID != msgs[1].ID || !msgs[1].Redelivered {
		t.Fatalf("duplicate has ID %q (first %q), Redelivered %v", msgs[1].ID, msgs[0].ID, msgs[1].Redelivered)
	}
	// Either copy settles the message; the other's Ack is then a no-op.
	if err := src.Ack(t.Context(), msgs[1:2]); err != nil {
		t.Fatal(err)
	}
	if err := src.Ack(t.Context(), msgs[:1]); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats("t"); st.Acks != 1 || st.Deliveries != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFaultDuplicateWithoutRoom(t *testing.T) {
	b := memsource.New(memsource.Config{})
	b.Inject(memsource.Fault{Kind: memsource.Redelivered})
	publish(b, "t", "a", "b")
	src := b.Source("t")
	if got := keys(recv(t, src, 1)); !slices.Equal(got, []string{"a#1"}) {
		t.Fatalf("first Receive got %v", got)
	}
	if got := keys(recv(t, src, 1)); !slices.Equal(got, []string{"a#2"}) {
		t.Fatalf("second Receive got %v, want the duplicate next", got)
	}
}

func TestFaultConcurrentDuplicate(t *testing.T) {
	b := memsource.New(memsource.Config{})
	b.Inject(memsource.Fault{Kind: memsource.ConcurrentDuplicate, Topic: "t"})
	publish(b, "t", "a")
	one, two := b.Source("t"), b.Source("t")
	m1 := recv(t, one, 10)
	expectNone(t, one, 30*time.Millisecond) // the copy is for another source
	m2 := recv(t, two, 10)
	if len(m1) != 1 || len(m2) != 1 || m1[0].ID != m2[0].ID || m2[0].Attempt != 2 {
		t.Fatalf("first source got %v, second %v: want the same message at once", keys(m1), keys(m2))
	}
	if st := b.Stats("t"); st.InFlight != 1 || st.Deliveries != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFaultDropAckAndAckError(t *testing.T) {
	b := memsource.New(memsource.Config{VisibilityTimeout: 50 * time.Millisecond})
	b.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Key: "a"})
	boom := errors.New("boom")
	b.Inject(memsource.Fault{Kind: memsource.AckError, Key: "b", Err: boom})
	publish(b, "t", "a", "b", "c")
	src := b.Source("t")
	msgs := recv(t, src, 10)
	err := src.Ack(t.Context(), msgs)
	if !errors.Is(err, boom) {
		t.Fatalf("Ack: %v, want boom for b", err)
	}
	if st := b.Stats("t"); st.Acks != 1 || st.DroppedAcks != 2 || st.InFlight != 2 {
		t.Fatalf("stats %+v", st)
	}
	// The dropped and failed acks come back after the visibility timeout.
	var again []*consumer.Message
	for len(again) < 2 {
		again = append(again, recv(t, src, 10)...)
	}
	got := keys(again)
	slices.Sort(got)
	if !slices.Equal(got, []string{"a#2", "b#2"}) {
		t.Fatalf("after the visibility timeout got %v", got)
	}
	if err := src.Ack(t.Context(), again); err != nil {
		t.Fatalf("Ack once the faults are used up: %v", err)
	}
}

func TestFaultReceiveErrorAndUnavailable(t *testing.T) {
	b := memsource.New(memsource.Config{})
	b.Inject(memsource.Fault{Kind: memsource.ReceiveError, Times: 2})
	publish(b, "t", "a")
	src := b.Source("t")
	for range 2 {
		if _, err := src.Receive(t.Context(), 1); !errors.Is(err, memsource.ErrUnavailable) || !errors.Is(err, memsource.ErrInjected) {
			t.Fatalf("Receive: %v, want ErrUnavailable and ErrInjected", err)
		}
	}
	m := recv(t, src, 1)

	b.SetUnavailable(true)
	if err := src.Ack(t.Context(), m); !errors.Is(err, memsource.ErrUnavailable) {
		t.Fatalf("Ack while unavailable: %v", err)
	}
	b.SetUnavailable(false)

	// A Receive blocked on an empty topic returns when the broker goes down.
	if err := src.Ack(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := src.Receive(context.Background(), 1)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	b.SetUnavailable(true)
	select {
	case err := <-errc:
		if !errors.Is(err, memsource.ErrUnavailable) {
			t.Fatalf("blocked Receive: %v, want ErrUnavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("blocked Receive did not return when the broker became unavailable")
	}
}

func TestFaultRetryAndDeadLetterErrors(t *testing.T) {
	b := memsource.New(memsource.Config{})
	b.Inject(memsource.Fault{Kind: memsource.RetryError})
	b.Inject(memsource.Fault{Kind: memsource.DeadLetterError})
	publish(b, "t", "a")
	src := b.Source("t")
	m := recv(t, src, 1)[0]
	if err := src.Retry(t.Context(), m, 0); !errors.Is(err, memsource.ErrInjected) {
		t.Fatalf("Retry: %v", err)
	}
	if err := src.DeadLetter(t.Context(), m, errors.New("x")); !errors.Is(err, memsource.ErrInjected) {
		t.Fatalf("DeadLetter: %v", err)
	}
	if st := b.Stats("t"); st.InFlight != 1 || st.Retries != 0 || st.DeadLettered != 0 {
		t.Fatalf("failed settlements changed state: %+v", st)
	}
	if err := src.DeadLetter(t.Context(), m, errors.New("x")); err != nil {
		t.Fatal(err)
	}
}

func TestFaultProbabilityIsDeterministic(t *testing.T) {
	dropped := func(seed uint64) []string {
		b := memsource.New(memsource.Config{Seed: seed})
		b.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Probability: 0.3, Times: -1})
		var ks []string
		for i := range 200 {
			ks = append(ks, fmt.Sprintf("k%03d", i))
		}
		publish(b, "t", ks...)
		src := b.Source("t")
		var out []string
		for range 200 {
			m := recv(t, src, 1)
			if err := src.Ack(t.Context(), m); err != nil {
				t.Fatal(err)
			}
			if b.Stats("t").DroppedAcks > uint64(len(out)) {
				out = append(out, m[0].Key)
			}
		}
		return out
	}
	a, b := dropped(7), dropped(7)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different faults:\n%v\n%v", a, b)
	}
	if len(a) < 30 || len(a) > 90 {
		t.Fatalf("%d of 200 acks dropped with probability 0.3", len(a))
	}
	if slices.Equal(a, dropped(8)) {
		t.Fatal("different seeds dropped the same acks")
	}
}

func TestPartitionKeyHeldByOneSource(t *testing.T) {
	b := memsource.New(memsource.Config{})
	b.Publish("t",
		memsource.Outgoing{Key: "p1", PartitionKey: "p"},
		memsource.Outgoing{Key: "p2", PartitionKey: "p"},
		memsource.Outgoing{Key: "q1", PartitionKey: "q"},
	)
	one, two := b.Source("t"), b.Source("t")
	m := recv(t, one, 1) // p1
	if got := keys(recv(t, two, 10)); !slices.Equal(got, []string{"q1#1"}) {
		t.Fatalf("second source got %v, want only q1 while p1 is in flight at the first", got)
	}
	if got := keys(recv(t, one, 10)); !slices.Equal(got, []string{"p2#1"}) {
		t.Fatalf("first source got %v, want p2 (it holds partition p)", got)
	}
	_ = m
}

func TestPartitionKeyWaitsForRetry(t *testing.T) {
	b := memsource.New(memsource.Config{})
	b.Publish("t",
		memsource.Outgoing{Key: "p1", PartitionKey: "p"},
		memsource.Outgoing{Key: "p2", PartitionKey: "p"},
	)
	src := b.Source("t")
	m := recv(t, src, 1)
	if err := src.Retry(t.Context(), m[0], 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// p2 must wait for p1's redelivery.
	if got := keys(recv(t, src, 10)); !slices.Equal(got, []string{"p1#2", "p2#1"}) {
		t.Fatalf("got %v, want p1 again before p2", got)
	}
}

func TestRestart(t *testing.T) {
	b := memsource.New(memsource.Config{})
	publish(b, "t", "a")
	src := b.Source("t")
	m := recv(t, src, 1)
	b.Restart()
	if err := src.Ack(t.Context(), m); !errors.Is(err, memsource.ErrDeliveryExpired) {
		t.Fatalf("Ack of a delivery from before the restart: %v, want ErrDeliveryExpired", err)
	}
	again := recv(t, src, 1)
	if again[0].Attempt != 2 || again[0].ID != m[0].ID {
		t.Fatalf("after restart got %v", keys(again))
	}
	if err := src.Ack(t.Context(), again); err != nil {
		t.Fatal(err)
	}
}

func TestBrokerClose(t *testing.T) {
	b := memsource.New(memsource.Config{})
	src := b.Source("t")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Receive(t.Context(), 1); !errors.Is(err, consumer.ErrClosed) {
		t.Fatalf("Receive after Broker.Close: %v", err)
	}
	if _, err := b.Source("t").Receive(t.Context(), 1); !errors.Is(err, consumer.ErrClosed) {
		t.Fatalf("Receive on a source opened after Broker.Close: %v", err)
	}
}

func TestEvents(t *testing.T) {
	var mu sync.Mutex
	var events []memsource.Event
	b := memsource.New(memsource.Config{OnEvent: func(e memsource.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}})
	publish(b, "t", "a", "b")
	src := b.Source("t", memsource.WithName("worker"))
	msgs := recv(t, src, 2)
	_ = src.Ack(t.Context(), msgs[:1])
	_ = src.Retry(t.Context(), msgs[1], time.Millisecond)
	_ = src.Close()

	mu.Lock()
	defer mu.Unlock()
	var got []string
	for i, e := range events {
		if i > 0 && e.Seq <= events[i-1].Seq {
			t.Fatalf("event %d has Seq %d after %d", i, e.Seq, events[i-1].Seq)
		}
		got = append(got, fmt.Sprintf("%s:%s:%s", e.Kind, e.Key, e.Source))
	}
	want := []string{"publish:a:", "publish:b:", "receive:a:worker", "receive:b:worker", "ack:a:worker", "retry:b:worker", "close::worker"}
	if !slices.Equal(got, want) {
		t.Fatalf("events\n%v\nwant\n%v", got, want)
	}
}
