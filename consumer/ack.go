package consumer

import (
	"context"
	"log/slog"
	"time"
)

// ackQueue is how many settled batches a lane may hand to its acker before
// it waits for the broker: enough to keep handling while an Ack is in
// flight, little enough that a slow broker slows the lane down.
const ackQueue = 8

// An acker acknowledges the committed messages of one lane in the
// background. A lane hands it each settled batch and goes on to the next
// one, so that handling overlaps with the broker's confirmation instead of
// waiting a round trip per batch (per message at BatchSize 1). The acker
// sends what queued up while its last Ack was in flight in one Ack call,
// in the order the lane settled it. Acknowledging later never breaks the
// guarantee: every message it acknowledges is committed (or a duplicate),
// and one whose Ack is lost is redelivered and recognised.
type acker struct {
	src  Source
	env  *pathEnv // the logger, counters and observer
	out  *outage  // the acknowledgements' run of failures (see Health)
	ctx  context.Context
	in   chan ackBatch
	done chan struct{}
}

// ackBatch is the part of a settled batch to acknowledge.
type ackBatch struct {
	jobs []*job // handled and duplicate jobs, in batch order
	size int    // messages in the batch, for SettleInfo.BatchSize
}

// startAcker starts the acker of a lane, acknowledging through src and
// reporting to env and out. Its Acks use ctx, which the runner cancels when
// the drain times out.
func startAcker(ctx context.Context, src Source, env *pathEnv, out *outage) *acker {
	a := &acker{src: src, env: env, out: out, ctx: ctx, in: make(chan ackBatch, ackQueue), done: make(chan struct{})}
	go a.run()
	return a
}

// send queues b, waiting while ackQueue batches are queued already.
func (a *acker) send(b ackBatch) { a.in <- b }

// stop waits until everything sent has been acknowledged (or has failed to).
func (a *acker) stop() {
	close(a.in)
	<-a.done
}

func (a *acker) run() {
	defer close(a.done)
	var bs []ackBatch // reused: ack keeps none of it
	for b := range a.in {
		clear(bs) // let the jobs of the last call go
		bs = append(bs[:0], b)
	more:
		for {
			select {
			case b, ok := <-a.in:
				if !ok {
					break more
				}
				bs = append(bs, b)
			default:
				break more
			}
		}
		a.ack(a.ctx, bs)
	}
}

// ack acknowledges the messages of bs with one Ack call and reports the
// outcome to the hooks, the counters and the outage log.
func (a *acker) ack(ctx context.Context, bs []ackBatch) {
	obs, log := a.env.obs, a.env.log
	var msgs []*Message
	for _, b := range bs {
		for _, j := range b.jobs {
			msgs = append(msgs, j.msg)
		}
	}
	start := time.Now()
	err := a.src.Ack(ctx, msgs)
	if len(obs.ack) > 0 {
		info := AckInfo{Messages: msgs, Start: start, End: time.Now(), Err: err}
		for _, h := range obs.ack {
			h.OnAck(ctx, info)
		}
	}
	if len(obs.settled) > 0 {
		for _, b := range bs {
			for _, j := range b.jobs {
				o := OutcomeHandled
				if j.out == outDuplicate {
					o = OutcomeDuplicate
				}
				obs.onSettled(j, o, b.size, err)
			}
		}
	}
	if err != nil {
		// Harmless for correctness: the effect is committed, and the
		// redelivery is recognised as a duplicate.
		a.env.stats.ackFailures.Add(uint64(len(msgs)))
		a.out.failed(ctx, log, err)
		a.out.line(ctx, log, slog.LevelWarn, "ack failed after commit; redeliveries will be deduplicated",
			slog.Int(LogKeyCount, len(msgs)), slog.Any(LogKeyError, err))
		return
	}
	a.out.ok(ctx, log)
}
