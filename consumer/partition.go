package consumer

import "fmt"

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
	j.set(outRetryInfra, fmt.Errorf("idemq: held behind failed message %q of partition %q", failed.key, j.msg.PartitionKey))
	j.claimedNew = false // its claim was rolled back and its handler did not run
	j.delay = failed.delay
}
