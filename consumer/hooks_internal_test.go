package consumer

import "testing"

// The duplicate's reason: a copy that met its key earlier in the batch is
// concurrent, a delivery the broker marks as a repeat is a redelivery, and
// a first delivery of a processed key is a producer's re-send.
func TestDuplicateReason(t *testing.T) {
	for _, c := range []struct {
		j    job
		want DuplicateReason
	}{
		{job{msg: &Message{Attempt: 1}, follower: true}, DuplicateConcurrent},
		{job{msg: &Message{Attempt: 2, Redelivered: true}, follower: true}, DuplicateConcurrent},
		{job{msg: &Message{Attempt: 2, Redelivered: true}}, DuplicateRedelivery},
		{job{msg: &Message{Attempt: 1, Redelivered: true}}, DuplicateRedelivery},
		{job{msg: &Message{Attempt: 3}}, DuplicateRedelivery},
		{job{msg: &Message{Attempt: 1}}, DuplicateProducer},
	} {
		if got := duplicateReason(&c.j); got != c.want {
			t.Errorf("%+v (follower %v): %v, want %v", *c.j.msg, c.j.follower, got, c.want)
		}
	}
}
