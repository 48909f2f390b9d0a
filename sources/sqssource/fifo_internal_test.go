package sqssource

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/idemq/idemq/consumer"
)

// orderSource is a Source with no client, enough for the in-flight tracking
// and FIFO order code, which never calls SQS.
func orderSource(fifo, relaxed bool) *Source {
	return &Source{
		cfg:      Config{RelaxedFIFOOrder: relaxed},
		log:      slog.New(slog.DiscardHandler),
		fifo:     fifo,
		inflight: make(map[*handle]struct{}),
		active:   make(map[string]*handle),
		wake:     make(chan struct{}),
	}
}

// receiveForTest adds a received message of group to s's ready buffer, as
// poll does.
func receiveForTest(s *Source, id, group string) *consumer.Message {
	h := &handle{src: s, id: id, group: group}
	m := consumer.Deliver(&consumer.Message{ID: id, PartitionKey: group}, consumer.Delivery{Handle: h})
	s.inflight[h] = struct{}{}
	s.ready = append(s.ready, m)
	return m
}

func ids(msgs []*consumer.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func readyIDs(s *Source) []string { return ids(s.ready) }

func handleIDs(hs []*handle) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.id
	}
	return out
}

func wantIDs(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s = %q, want %q", what, got, want)
	}
}

// In strict FIFO order, take hands out one message per group and none of a
// group whose message is unsettled; settling it frees the group and wakes
// Receive; a message given back takes its group's later messages with it.
func TestStrictFIFOTakeAndGiveBack(t *testing.T) {
	s := orderSource(true, false)
	a1 := receiveForTest(s, "a1", "a")
	receiveForTest(s, "a2", "a")
	receiveForTest(s, "b1", "b")
	receiveForTest(s, "a3", "a")
	receiveForTest(s, "c1", "c")
	receiveForTest(s, "b2", "b")

	wantIDs(t, "take(2)", ids(s.take(2)), "a1", "b1")
	wantIDs(t, "ready after take(2)", readyIDs(s), "a2", "a3", "c1", "b2")
	wantIDs(t, "take(10)", ids(s.take(10)), "c1")
	wantIDs(t, "take(10) with every group busy", ids(s.take(10)))

	wake := s.wake
	s.untrack(consumer.DeliveryOf(a1).Handle.(*handle))
	select {
	case <-wake:
	default:
		t.Fatal("untrack of a group's active message did not wake Receive")
	}
	if _, ok := s.inflight[consumer.DeliveryOf(a1).Handle.(*handle)]; ok {
		t.Fatal("untracked message is still in flight")
	}
	a2 := s.take(10)
	wantIDs(t, "take(10) after a1 settled", ids(a2), "a2")
	wantIDs(t, "ready", readyIDs(s), "a3", "b2")

	// a2 goes back to the queue (Retry): a3, already received, must follow it.
	followers := s.untrackWithFollowers(consumer.DeliveryOf(a2[0]).Handle.(*handle))
	wantIDs(t, "followers of a2", handleIDs(followers), "a3")
	wantIDs(t, "ready after untrackWithFollowers", readyIDs(s), "b2")
	for _, id := range []string{"a2", "a3"} {
		for h := range s.inflight {
			if h.id == id {
				t.Fatalf("%s is still in flight after untrackWithFollowers", id)
			}
		}
	}
	if s.active["a"] != nil {
		t.Fatal("group a is still blocked after untrackWithFollowers")
	}
	if s.active["b"] == nil || s.active["b"].id != "b1" {
		t.Fatalf("group b's active message = %v, want b1", s.active["b"])
	}
	wantIDs(t, "take(10) while b1 is unsettled", ids(s.take(10)))
}

// Without strict order (standard queues, or RelaxedFIFOOrder), take hands out
// messages in receive order up to max, whatever their group, and a message
// given back takes no followers.
func TestTakeWithoutStrictOrder(t *testing.T) {
	for _, tc := range []struct {
		name          string
		fifo, relaxed bool
	}{
		{"standard", false, false},
		{"relaxed FIFO", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := orderSource(tc.fifo, tc.relaxed)
			for _, id := range []string{"a1", "a2", "b1", "a3"} {
				receiveForTest(s, id, id[:1])
			}
			got := s.take(3)
			wantIDs(t, "take(3)", ids(got), "a1", "a2", "b1")
			wantIDs(t, "ready", readyIDs(s), "a3")
			if len(s.active) != 0 {
				t.Fatalf("active = %v, want none", s.active)
			}
			if f := s.untrackWithFollowers(consumer.DeliveryOf(got[0]).Handle.(*handle)); len(f) != 0 {
				t.Fatalf("untrackWithFollowers returned followers %q, want none", handleIDs(f))
			}
			wantIDs(t, "ready after untrackWithFollowers", readyIDs(s), "a3")
		})
	}
}
