package consumer

import (
	"errors"
	"fmt"
	"time"
)

// order keeps the messages of a partition key in order in one lane, where
// they all go (laneOf): Runner.handle admits a batch through it and records
// what the batch handed back once it is settled; the paths ask it, between
// the transactions or messages they run, which jobs may still run. Used by
// its lane's goroutine only.
//
// Within a batch, the messages after a failed one of their partition wait
// for it (retried without counting an attempt, as late as it); earlier ones
// precede it anyway. Across batches, a message handed back (Retry or
// Release) comes back through the broker, and the messages of its partition
// received before the hand-back, already in the lane, wait for it too. The
// broker orders what it delivers after the hand-back, the message's own
// redelivery included; a lane's jobs arrive in receive order, so such a
// hold ends once the lane has seen a job received after it.
type order struct {
	failed map[string]*job     // the batch's failed message of each partition key
	back   map[string]laneHold // the last message handed back of each partition key
}

// laneHold is the hold of one partition key from one batch to the next.
type laneHold struct {
	key string    // the deduplication key of the last message handed back
	seq uint64    // jobs received up to this one (job.seq) came before it
	due time.Time // when the last message handed back may come back
}

// admit starts a batch: the jobs of live that wait behind a message handed
// back get that outcome; it returns the others, in order, and drops the
// holds that no later job can be covered by.
func (o *order) admit(live []*job) []*job {
	clear(o.failed)
	if len(o.back) == 0 || len(live) == 0 {
		return live
	}
	out := live[:0:0]
	var last uint64
	for _, j := range live {
		last = max(last, j.seq)
		hold, ok := o.back[j.msg.PartitionKey]
		if !ok || j.msg.PartitionKey == "" || j.seq > hold.seq || j.key == hold.key {
			// Not behind it: received after it was handed back, or
			// its own redelivery, however soon that came.
			out = append(out, j)
			continue
		}
		waitBehind(j, hold.key, max(time.Until(hold.due), time.Millisecond))
	}
	for pk, hold := range o.back {
		if hold.seq < last {
			delete(o.back, pk)
		}
	}
	return out
}

// settled ends a batch: a job of batch handed back (retried, or left to the
// broker by a failed Retry: it comes again) holds its partition key for the
// jobs received so far (up to seq), due no sooner than its delay from now.
func (o *order) settled(batch []*job, seq uint64) {
	for _, j := range batch {
		pk := j.msg.PartitionKey
		if pk == "" || (j.out != outRetry && j.out != outRetryInfra) {
			continue
		}
		if o.back == nil {
			o.back = map[string]laneHold{}
		}
		due := time.Now().Add(max(j.delay, 0))
		if old, ok := o.back[pk]; ok && old.due.After(due) {
			due = old.due
		}
		o.back[pk] = laneHold{key: j.key, seq: seq, due: due}
	}
}

// has reports whether a failed message of partition pk is held in the
// batch; an empty pk is never held.
func (o *order) has(pk string) bool { return pk != "" && o.failed[pk] != nil }

// hold makes failed, when it is to be retried, hold the later messages of
// its partition in the batch.
func (o *order) hold(failed *job) {
	if failed.msg.PartitionKey == "" || (failed.out != outRetry && failed.out != outRetryInfra) {
		return
	}
	if o.failed == nil {
		o.failed = map[string]*job{}
	}
	o.failed[failed.msg.PartitionKey] = failed
}

// pending returns the jobs still to run, in order: those without an outcome
// that do not come after a failed message of their partition in jobs. The
// held ones get their outcome. A failed job stays in jobs (with its
// outcome) until the pending call after its failure, so the jobs held then
// are exactly the later ones.
func (o *order) pending(jobs []*job) []*job {
	if len(o.failed) == 0 && allPending(jobs) {
		return jobs // the first try of a batch: nothing to drop or hold
	}
	var behind map[string]bool // partitions whose failed job came earlier in jobs
	out := make([]*job, 0, len(jobs))
	for _, j := range jobs {
		if pk := j.msg.PartitionKey; pk != "" && o.failed[pk] == j {
			if behind == nil {
				behind = map[string]bool{}
			}
			behind[pk] = true
		}
		if j.out != outNone {
			continue
		}
		if behind[j.msg.PartitionKey] {
			o.holdBack(j)
			continue
		}
		out = append(out, j)
	}
	return out
}

// inTurn calls run for each job of jobs in order (the lease path runs its
// batch so), telling it whether a failed message of its partition came
// before, in which case j already has the outcome of waiting for it. A job
// that run leaves failed holds the later ones.
func (o *order) inTurn(jobs []*job, run func(i int, j *job, held bool)) {
	for i, j := range jobs {
		held := o.has(j.msg.PartitionKey)
		if held {
			o.holdBack(j)
		}
		run(i, j, held)
		if !held {
			o.hold(j)
		}
	}
}

func allPending(jobs []*job) bool {
	for _, j := range jobs {
		if j.out != outNone {
			return false
		}
	}
	return true
}

// holdBack gives j, which comes after a failed message of its partition in
// the batch, the outcome of waiting for it: retried without counting an
// attempt, as late as the failed one.
func (o *order) holdBack(j *job) {
	failed := o.failed[j.msg.PartitionKey]
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

func isHeldBehind(err error) bool {
	var he *heldError
	return errors.As(err, &he)
}
