package demo

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
)

// Metrics is what the runner's hooks saw during a demo run, added up over
// the worker lives like the counters of Summary.
type Metrics struct {
	// Duplicates counts the duplicates by reason (consumer.DuplicateReason:
	// "redelivery", "concurrent", "producer").
	Duplicates map[string]uint64
	// Handler is the handler's run time, per run; Commit the time of each
	// successful commit, per message it made durable.
	Handler, Commit Latency
}

// Latency summarises a histogram of durations. The percentiles are the
// upper bounds of the histogram buckets they fall in (buckets grow by 25 %).
type Latency struct {
	Count    uint64
	P50, P99 time.Duration
}

// FormatLatency renders d in milliseconds, as the summary prints it.
func FormatLatency(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// bucketBounds are the upper bounds of the latency histogram: 10 µs, then
// 25 % more each, up to about 11 s; a last bucket takes the rest.
var bucketBounds = func() []time.Duration {
	b := make([]time.Duration, 63)
	for i := range b {
		b[i] = time.Duration(10e3 * math.Pow(1.25, float64(i)))
	}
	return b
}()

// histogram counts durations in bucketBounds' buckets (len+1 counts).
type histogram []uint64

func newHistogram() histogram { return make(histogram, len(bucketBounds)+1) }

func (h histogram) observe(d time.Duration) {
	lo, hi := 0, len(bucketBounds)
	for lo < hi { // first bound >= d
		mid := (lo + hi) / 2
		if bucketBounds[mid] < d {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	h[lo]++
}

// add adds o's counts to h (which must be as long).
func (h histogram) add(o histogram) {
	for i := range min(len(h), len(o)) {
		h[i] += o[i]
	}
}

// latency returns the count and the percentiles of h.
func (h histogram) latency() Latency {
	var l Latency
	for _, n := range h {
		l.Count += n
	}
	l.P50, l.P99 = h.quantile(l.Count, 0.50), h.quantile(l.Count, 0.99)
	return l
}

func (h histogram) quantile(count uint64, q float64) time.Duration {
	if count == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(count)))
	var seen uint64
	for i, n := range h {
		seen += n
		if seen >= rank {
			return bucketBounds[min(i, len(bucketBounds)-1)]
		}
	}
	return bucketBounds[len(bucketBounds)-1]
}

// metricsHook is the consumer.Hook of a demo worker: it counts duplicates by
// reason and histograms the handler and commit times. It is safe for
// concurrent use.
type metricsHook struct {
	mu                           sync.Mutex
	redelivery, concurrent, prod uint64
	handler, commit              histogram
}

func newMetricsHook() *metricsHook {
	return &metricsHook{handler: newHistogram(), commit: newHistogram()}
}

var (
	_ consumer.HookClaimed    = (*metricsHook)(nil)
	_ consumer.HookHandlerEnd = (*metricsHook)(nil)
	_ consumer.HookCommit     = (*metricsHook)(nil)
)

func (h *metricsHook) OnClaimed(_ context.Context, _ *consumer.Message, c consumer.ClaimInfo) {
	if c.State != dedup.StateDone {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch c.Reason {
	case consumer.DuplicateRedelivery:
		h.redelivery++
	case consumer.DuplicateConcurrent:
		h.concurrent++
	default:
		h.prod++
	}
}

func (h *metricsHook) OnHandlerEnd(_ context.Context, _ *consumer.Message, d time.Duration, _ error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handler.observe(d)
}

func (h *metricsHook) OnCommit(_ context.Context, _ *consumer.Message, c consumer.CommitInfo) {
	if c.Err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.commit.observe(c.End.Sub(c.Start))
}

// fill copies the hook's counts into r.
func (h *metricsHook) fill(r *report) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.DupRedelivery, r.DupConcurrent, r.DupProducer = h.redelivery, h.concurrent, h.prod
	r.Handler = append(histogram(nil), h.handler...)
	r.Commit = append(histogram(nil), h.commit...)
}
