package consumer

import (
	"errors"
	"fmt"
	"time"
)

// heldPartitions tracks the partition keys of a batch whose message failed.
// Later messages of the same partition are not handled in that batch (they
// would overtake the failed one); they are retried without counting an
// attempt. Earlier ones are handled: they precede it anyway.
type heldPartitions map[string]*job

// has reports whether a failed message of partition pk is held; an empty pk
// is never held.
func (h heldPartitions) has(pk string) bool { return pk != "" && h[pk] != nil }

func (h *heldPartitions) hold(failed *job) {
	if failed.msg.PartitionKey == "" || (failed.out != outRetry && failed.out != outRetryInfra) {
		return
	}
	if *h == nil {
		*h = heldPartitions{}
	}
	(*h)[failed.msg.PartitionKey] = failed
}

// pending returns the jobs still to run, in order: those without an outcome
// that do not come after a failed message of their partition in jobs. The
// held ones get their outcome. A failed job stays in jobs (with its
// outcome) until the pending call after its failure, so the jobs held then
// are exactly the later ones.
func (h heldPartitions) pending(jobs []*job) []*job {
	if len(h) == 0 && allPending(jobs) {
		return jobs // the first try of a batch: nothing to drop or hold
	}
	var behind map[string]bool // partitions whose failed job came earlier in jobs
	out := make([]*job, 0, len(jobs))
	for _, j := range jobs {
		if pk := j.msg.PartitionKey; pk != "" && h[pk] == j {
			if behind == nil {
				behind = map[string]bool{}
			}
			behind[pk] = true
		}
		if j.out != outNone {
			continue
		}
		if behind[j.msg.PartitionKey] {
			h.holdBack(j)
			continue
		}
		out = append(out, j)
	}
	return out
}

// allPending reports whether no job of jobs has an outcome yet.
func allPending(jobs []*job) bool {
	for _, j := range jobs {
		if j.out != outNone {
			return false
		}
	}
	return true
}

// holds reports whether a failed message of j's partition was held before
// j's turn came (the lease path runs its batch in order), and if so holds j
// back.
func (h heldPartitions) holds(j *job) bool {
	if j.msg.PartitionKey == "" || h[j.msg.PartitionKey] == nil {
		return false
	}
	h.holdBack(j)
	return true
}

// holdBack gives j, which comes after a failed message of its partition, the
// outcome of waiting for it: retried without counting an attempt, as late
// as the failed one.
func (h heldPartitions) holdBack(j *job) {
	failed := h[j.msg.PartitionKey]
	waitBehind(j, failed.key, failed.delay)
}

// waitBehind gives j the outcome of waiting behind the message of its
// partition with key ahead: retried without counting an attempt, delay
// from now. Its claim, if it had one, was rolled back and its handler did
// not run.
func waitBehind(j *job, ahead string, delay time.Duration) {
	j.out, j.delay = outRetryInfra, delay
	j.err = &heldError{ahead: ahead, partition: j.msg.PartitionKey}
}

// heldError is the retry reason of a message held behind an earlier one of
// its partition. Its claim, if it had one, is not reported (HookClaimed).
type heldError struct{ ahead, partition string }

func (e *heldError) Error() string {
	return fmt.Sprintf("idemq: held behind message %q of partition %q", e.ahead, e.partition)
}

// isHeldBehind reports whether err is a heldError.
func isHeldBehind(err error) bool {
	var he *heldError
	return errors.As(err, &he)
}

// laneHolds carries partition holding from one batch of a lane to the next.
// A message handed back for a later attempt (Retry or Release, with a
// delay) comes back through the broker; the messages of its partition that
// the runner received before it was handed back are already in the lane,
// and a later batch would commit them ahead of it. laneHolds hands those
// back behind it instead: retried without counting an attempt, due no
// sooner than the message they wait for, in their order. Messages received
// after the hand-back are the broker's to order (it delivers a partition
// key in order), and so is the handed-back message itself.
//
// A lane's jobs arrive in receive order, so a hold is dropped once the lane
// has seen a job received after it. It is used by its lane's goroutine only.
type laneHolds map[string]laneHold

// laneHold is the hold of one partition key.
type laneHold struct {
	key string    // the deduplication key of the last message handed back
	seq uint64    // jobs received up to this one (job.seq) came before it
	due time.Time // when the last message handed back may come back
}

// handedBack records that j, of a partition key, was handed back to come
// again no sooner than j.delay from now; every job received so far (up to
// seq) is behind it.
func (h *laneHolds) handedBack(j *job, seq uint64) {
	pk := j.msg.PartitionKey
	if pk == "" {
		return
	}
	if *h == nil {
		*h = laneHolds{}
	}
	due := time.Now().Add(max(j.delay, 0))
	if old, ok := (*h)[pk]; ok && old.due.After(due) {
		due = old.due
	}
	(*h)[pk] = laneHold{key: j.key, seq: seq, due: due}
}

// holdBack gives every job of live that a hold covers the outcome of
// waiting behind the message handed back, and returns the others, in
// order. It then drops the holds that no later job can be covered by.
func (h laneHolds) holdBack(live []*job) []*job {
	if len(h) == 0 || len(live) == 0 {
		return live
	}
	out := live[:0:0]
	var last uint64
	for _, j := range live {
		last = max(last, j.seq)
		hold, ok := h[j.msg.PartitionKey]
		if !ok || j.msg.PartitionKey == "" || j.seq > hold.seq || j.key == hold.key {
			// Not behind it: received after it was handed back, or
			// its own redelivery, however soon that came.
			out = append(out, j)
			continue
		}
		waitBehind(j, hold.key, max(time.Until(hold.due), time.Millisecond))
	}
	for pk, hold := range h {
		if hold.seq < last {
			delete(h, pk)
		}
	}
	return out
}
