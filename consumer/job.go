package consumer

import (
	"context"
	"time"

	"github.com/idemq/idemq/dedup"
)

// fate is what the runner does with a message once its path is done;
// the settler carries it out, and the Outcome it reports follows from it.
type fate int

const (
	outNone       fate = iota // not settled: left to the broker
	outAck                    // effect durable now (handler ran and committed)
	outDuplicate              // effect was durable before; acknowledge
	outRetry                  // handler failed; retry with backoff or dead-letter
	outRetryInfra             // store or broker trouble; retry, never dead-letter
	outDeadLetter             // poison; dead-letter now
)

// job is one message moving through a Runner.
type job struct {
	msg    *Message
	seq    uint64 // its place in the runner's receive order, from 1
	key    string
	keyErr error // from Config.KeyFunc (or the source), checked by prepare
	hash   dedup.Hash

	out   fate
	err   error
	delay time.Duration // for outRetryInfra, or from RetryAfter

	// failures is the key's handler failures as the store counted them (0:
	// not counted; the broker's Attempt applies).
	failures int

	// ctx is the message's context: the receive context without its
	// cancellation, or what HookReceived returned (see hooks.go).
	ctx      context.Context
	follower bool        // the same key came earlier in the batch
	claim    claimRecord // its last claim, for HookClaimed (observer.noteClaim)
}

func (j *job) set(o fate, err error) { j.out, j.err = o, err }

// prepared is a batch ready for its path: the jobs to run (live, one per
// key) and the later copies of their keys (followers), settled after them.
// The jobs with bad input already have their outcome.
type prepared struct {
	batch, live, followers []*job
	// leaders maps a key to its live job; nil for a batch of one, which
	// has no followers.
	leaders map[string]*job
	one     [1]*job // live's array for a batch of one
}

// attempt is the attempt number the retry policy sees for j: its key's
// counted handler failures, else the broker's delivery count.
func (j *job) attempt() int {
	if j.failures > 0 {
		return j.failures
	}
	return j.msg.Attempt
}

func dedupRecords(jobs []*job) []dedup.Record {
	recs := make([]dedup.Record, len(jobs))
	for i, j := range jobs {
		recs[i] = dedup.Record{Key: j.key, PayloadHash: j.hash}
	}
	return recs
}

// claimRecord is the last claim of one job's key, kept on the job for the
// HookClaimed hooks (see observer.noteClaim).
type claimRecord struct {
	start, end time.Time
	n          int  // keys claimed together (ClaimInfo.Messages)
	isNew      bool // the key was claimed as new
}
