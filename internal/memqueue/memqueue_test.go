package memqueue_test

import (
	"testing"
	"time"

	"github.com/idemq/idemq/internal/memqueue"
)

type src struct{ name string }

type queue = memqueue.Queue[string, *src]

func take(q *queue, s *src, now time.Time, max int, h memqueue.Hooks[string, *src]) []*memqueue.Delivery[string, *src] {
	var got []*memqueue.Delivery[string, *src]
	h.Deliver = func(d *memqueue.Delivery[string, *src]) { got = append(got, d) }
	q.Take(s, now, max, time.Second, h)
	return got
}

func ids(ds []*memqueue.Delivery[string, *src]) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Msg.ID
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// One partition key's messages go to one source at a time, in publish
// order: while a delivery of the key is in flight to one source, another
// source gets none of the key's messages; other keys and keyless messages
// are not held up.
func TestPartitionKeyOneAtATime(t *testing.T) {
	q := memqueue.New[string, *src]()
	for _, m := range [][2]string{{"a1", "a"}, {"a2", "a"}, {"n1", ""}, {"b1", "b"}, {"n2", ""}} {
		q.Publish(m[0], m[1], m[0])
	}
	s1, s2 := &src{"1"}, &src{"2"}
	now := time.Now()
	first := take(q, s1, now, 1, memqueue.Hooks[string, *src]{})
	if want := []string{"a1"}; !equal(ids(first), want) {
		t.Fatalf("first take %v, want %v", ids(first), want)
	}
	if got, want := take(q, s2, now, 10, memqueue.Hooks[string, *src]{}), []string{"n1", "b1", "n2"}; !equal(ids(got), want) {
		t.Fatalf("second source took %v while a1 was in flight, want %v", ids(got), want)
	}
	q.Settle(first[0].Msg)
	if got := take(q, s2, now, 10, memqueue.Hooks[string, *src]{}); !equal(ids(got), []string{"a2"}) {
		t.Fatalf("after a1 settled: %v, want [a2]", ids(got))
	}
}

// A delivery not settled within the visibility timeout expires: its
// message goes out again with the next attempt, and settling the old
// delivery finds it expired.
func TestVisibilityTimeout(t *testing.T) {
	q := memqueue.New[string, *src]()
	q.Publish("m", "", "m")
	s := &src{"1"}
	now := time.Now()
	d1 := take(q, s, now, 1, memqueue.Hooks[string, *src]{})[0]
	if st := q.Check(d1, now.Add(999*time.Millisecond)); st != memqueue.Live {
		t.Fatalf("Check before the deadline: %v, want Live", st)
	}
	expired := 0
	later := now.Add(2 * time.Second)
	d2 := take(q, s, later, 1, memqueue.Hooks[string, *src]{Expire: func(*memqueue.Delivery[string, *src]) { expired++ }})
	if len(d2) != 1 || d2[0].Attempt != 2 || expired != 1 {
		t.Fatalf("redelivery %v (attempt %d), %d expired; want one, attempt 2, 1 expired", ids(d2), d2[0].Attempt, expired)
	}
	if st := q.Check(d1, later); st != memqueue.Expired {
		t.Fatalf("Check of the expired delivery: %v, want Expired", st)
	}
	q.Settle(d2[0].Msg)
	if st := q.Check(d2[0], later); st != memqueue.Settled {
		t.Fatalf("Check after Settle: %v, want Settled", st)
	}
	if r, f := q.Counts(); r != 0 || f != 0 {
		t.Fatalf("Counts %d ready %d in flight, want 0 0", r, f)
	}
}

// A retried message waits out its delay, and so does the rest of its key.
func TestRetryDelayHoldsItsKey(t *testing.T) {
	q := memqueue.New[string, *src]()
	q.Publish("k1", "k", "k1")
	q.Publish("k2", "k", "k2")
	s := &src{"1"}
	now := time.Now()
	d := take(q, s, now, 10, memqueue.Hooks[string, *src]{})[0]
	q.Retry(d, now, time.Minute)
	if got := take(q, s, now.Add(time.Second), 10, memqueue.Hooks[string, *src]{}); len(got) != 0 {
		t.Fatalf("during the retry delay: %v, want nothing", ids(got))
	}
	if got := take(q, s, now.Add(2*time.Minute), 10, memqueue.Hooks[string, *src]{}); !equal(ids(got), []string{"k1", "k2"}) {
		t.Fatalf("after the delay: %v, want [k1 k2]", ids(got))
	}
}

// Owed copies: a duplicate goes to any source (the same one at once), a
// concurrent copy only to another source while the first is in flight.
func TestOwedCopies(t *testing.T) {
	copies := func(dup, conc bool) memqueue.Hooks[string, *src] {
		return memqueue.Hooks[string, *src]{Copies: func(*memqueue.Message[string, *src]) (bool, bool) { return dup, conc }}
	}
	s1, s2 := &src{"1"}, &src{"2"}
	now := time.Now()

	q := memqueue.New[string, *src]()
	q.Publish("d", "", "d")
	if got := take(q, s1, now, 10, copies(true, false)); !equal(ids(got), []string{"d", "d"}) {
		t.Fatalf("duplicate: %v, want [d d]", ids(got))
	}

	q = memqueue.New[string, *src]()
	q.Publish("c", "", "c")
	if got := take(q, s1, now, 10, copies(false, true)); !equal(ids(got), []string{"c"}) {
		t.Fatalf("concurrent, first source: %v, want [c]", ids(got))
	}
	if got := take(q, s1, now, 10, memqueue.Hooks[string, *src]{}); len(got) != 0 {
		t.Fatalf("concurrent copy went to the same source: %v", ids(got))
	}
	got := take(q, s2, now, 10, memqueue.Hooks[string, *src]{})
	if !equal(ids(got), []string{"c"}) || got[0].Attempt != 2 {
		t.Fatalf("concurrent, second source: %v, want [c] attempt 2", ids(got))
	}
}

// Release returns a closed source's deliveries, or every delivery.
func TestRelease(t *testing.T) {
	q := memqueue.New[string, *src]()
	q.Publish("x", "", "x")
	q.Publish("y", "", "y")
	s1, s2 := &src{"1"}, &src{"2"}
	now := time.Now()
	take(q, s1, now, 1, memqueue.Hooks[string, *src]{})
	take(q, s2, now, 1, memqueue.Hooks[string, *src]{})
	var returned []string
	q.Release(s1, false, func(m *memqueue.Message[string, *src]) { returned = append(returned, m.ID) })
	if !equal(returned, []string{"x"}) {
		t.Fatalf("Release(s1): %v, want [x]", returned)
	}
	returned = nil
	q.Release(nil, true, func(m *memqueue.Message[string, *src]) { returned = append(returned, m.ID) })
	if !equal(returned, []string{"y"}) {
		t.Fatalf("Release(all): %v, want [y]", returned)
	}
	if r, f := q.Counts(); r != 2 || f != 0 {
		t.Fatalf("Counts %d ready %d in flight, want 2 0", r, f)
	}
}
