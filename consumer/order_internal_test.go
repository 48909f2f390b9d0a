package consumer

import (
	"slices"
	"testing"
	"time"
)

// A lane's hold covers the jobs of the partition received before the
// message was handed back, and no other: not other partitions, not jobs
// received after it, not the message's own redelivery. It ends once the
// lane has seen a job received after it.
func TestLaneHoldsCoverOnlyWhatCameBefore(t *testing.T) {
	mk := func(seq uint64, key, pk string) *job {
		return &job{seq: seq, key: key, msg: &Message{PartitionKey: pk}}
	}
	var holds order
	failed := mk(2, "p2", "a")
	failed.out, failed.delay = outRetry, time.Hour
	holds.settled([]*job{failed}, 5) // p3..p5 were received before the hand-back

	p3, other, p4 := mk(3, "p3", "a"), mk(4, "q4", "b"), mk(4, "p4", "a")
	if got := holds.admit([]*job{p3, other, p4}); !slices.Equal(got, []*job{other}) {
		t.Fatalf("live after the hold = %v, want only the other partition's job", got)
	}
	for _, j := range []*job{p3, p4} {
		if j.out != outRetryInfra || j.delay < 59*time.Minute {
			t.Fatalf("held job %s: outcome %v delay %v, want outRetryInfra due with p2 (about 1h)", j.key, j.out, j.delay)
		}
	}
	if _, ok := holds.back["a"]; !ok {
		t.Fatal("hold dropped before the lane saw a job received after it")
	}

	again, p6 := mk(5, "p2", "a"), mk(7, "p6", "a") // p2 came back before the hold was recorded
	if got := holds.admit([]*job{again, p6}); !slices.Equal(got, []*job{again, p6}) {
		t.Fatalf("live = %v: the redelivery and the jobs received after the hand-back are the broker's to order", got)
	}
	if len(holds.back) != 0 {
		t.Fatalf("holds = %v, want none once a later job was seen", holds.back)
	}
}
