package kafkasource

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// The ledger tests need no broker: they drive the ledger with entries named
// by partition and offset, as the fetch loop, Ack, Retry and the commit
// requests of a Source would.

// ledgerStep is one call on the ledger and what it must return.
type ledgerStep struct {
	op   string // "fetch", "settle", "drop", "block", "commit" or "fail"
	part int
	off  int64
	gen  int64  // fetch: the entry's generation (and join); commit: the current one
	key  string // fetch: the hold key

	held     bool          // fetch: held back behind a retried message
	released []int64       // settle: offsets handed out from the hold
	passed   int           // settle: entries the settled prefix passed
	commit   map[int]int64 // commit: partition → offset to commit
	stale    map[int]int64 // commit: partition → offset fenced off
}

func fetchStep(part int, off, gen int64) ledgerStep {
	return ledgerStep{op: "fetch", part: part, off: off, gen: gen}
}

func fetchKeyStep(part int, off, gen int64, key string, held bool) ledgerStep {
	return ledgerStep{op: "fetch", part: part, off: off, gen: gen, key: key, held: held}
}

func settleStep(part int, off int64, passed int, released ...int64) ledgerStep {
	return ledgerStep{op: "settle", part: part, off: off, passed: passed, released: released}
}

// dropStep settles an entry of an ended generation without an effect, as
// Source.dropLocked does.
func dropStep(part int, off int64, passed int) ledgerStep {
	return ledgerStep{op: "drop", part: part, off: off, passed: passed}
}

func blockStep(part int, off int64) ledgerStep {
	return ledgerStep{op: "block", part: part, off: off}
}

func commitStep(gen int64, want map[int]int64) ledgerStep {
	return ledgerStep{op: "commit", gen: gen, commit: want}
}

func commitStaleStep(gen int64, want, stale map[int]int64) ledgerStep {
	return ledgerStep{op: "commit", gen: gen, commit: want, stale: stale}
}

// fail reports the request of the previous commit step as failed.
func failStep() ledgerStep { return ledgerStep{op: "fail"} }

// ledgerRig runs ledgerSteps. An entry is named by its partition and
// offset; a refetched offset names the newest fetch.
type ledgerRig struct {
	t       *testing.T
	l       *ledger
	entries map[topicPartition]map[int64]*entry
	last    []prefix // what the previous commit step returned
}

func newLedgerRig(t *testing.T) *ledgerRig {
	return &ledgerRig{t: t, l: newLedger(), entries: map[topicPartition]map[int64]*entry{}}
}

func ledgerTP(part int) topicPartition { return topicPartition{"t", part} }

func (r *ledgerRig) entry(part int, off int64) *entry {
	r.t.Helper()
	e := r.entries[ledgerTP(part)][off]
	if e == nil {
		r.t.Fatalf("no entry %d/%d was fetched", part, off)
	}
	return e
}

func (r *ledgerRig) run(i int, s ledgerStep) {
	r.t.Helper()
	at := fmt.Sprintf("step %d (%s %d/%d)", i, s.op, s.part, s.off)
	switch s.op {
	case "fetch":
		tp := ledgerTP(s.part)
		e := &entry{offset: s.off, gen: s.gen, join: s.gen, holdKey: s.key}
		if r.entries[tp] == nil {
			r.entries[tp] = map[int64]*entry{}
		}
		r.entries[tp][s.off] = e
		if held := r.l.record(tp, e); held != s.held {
			r.t.Fatalf("%s: record held = %t, want %t", at, held, s.held)
		}
	case "settle", "drop":
		e := r.entry(s.part, s.off)
		e.dropped = s.op == "drop"
		released, passed := r.l.settle(e)
		var offs []int64
		for _, q := range released {
			offs = append(offs, q.offset)
		}
		if passed != s.passed || !slices.Equal(offs, s.released) {
			r.t.Fatalf("%s: settle passed %d and released %v, want %d and %v", at, passed, offs, s.passed, s.released)
		}
	case "block":
		r.l.block(r.entry(s.part, s.off))
	case "commit":
		commit, stale := r.l.committable(s.gen)
		r.last = commit
		if got := commitOffsets(commit); !maps.Equal(got, s.commit) {
			r.t.Fatalf("step %d (commit in generation %d): commit %v, want %v", i, s.gen, got, s.commit)
		}
		if got := commitOffsets(stale); !maps.Equal(got, s.stale) {
			r.t.Fatalf("step %d (commit in generation %d): fenced off %v, want %v", i, s.gen, got, s.stale)
		}
	case "fail":
		r.l.uncommit(r.last)
	default:
		r.t.Fatalf("%s: unknown op", at)
	}
}

// commitOffsets maps each prefix's partition to the offset a commit of it
// sends (the one after the newest message passed).
func commitOffsets(ps []prefix) map[int]int64 {
	out := map[int]int64{}
	for _, p := range ps {
		out[p.partition] = p.last + 1
	}
	return out
}

// noCommit is a commit step's want: nothing to commit.
var noCommit = map[int]int64{}

func TestLedger(t *testing.T) {
	tests := []struct {
		name  string
		steps []ledgerStep
	}{{
		name: "in-order settles commit each prefix once",
		steps: []ledgerStep{
			fetchStep(0, 0, 1), fetchStep(0, 1, 1), fetchStep(0, 2, 1),
			settleStep(0, 0, 1),
			commitStep(1, map[int]int64{0: 1}),
			settleStep(0, 1, 1), settleStep(0, 2, 1),
			commitStep(1, map[int]int64{0: 3}),
			commitStep(1, noCommit),
		},
	}, {
		name: "out-of-order settles wait for the head",
		steps: []ledgerStep{
			fetchStep(0, 0, 1), fetchStep(0, 1, 1), fetchStep(0, 2, 1), fetchStep(0, 3, 1),
			settleStep(0, 3, 0), settleStep(0, 1, 0),
			commitStep(1, noCommit),
			settleStep(0, 2, 0),
			commitStep(1, noCommit),
			settleStep(0, 0, 4),
			commitStep(1, map[int]int64{0: 4}),
		},
	}, {
		name: "the prefix is committed only once it is contiguous",
		steps: []ledgerStep{
			fetchStep(0, 10, 1), fetchStep(0, 11, 1), fetchStep(0, 12, 1),
			settleStep(0, 11, 0),
			commitStep(1, noCommit),
			settleStep(0, 10, 2),
			commitStep(1, map[int]int64{0: 12}),
			settleStep(0, 12, 1),
			commitStep(1, map[int]int64{0: 13}),
		},
	}, {
		name: "settling twice changes nothing",
		steps: []ledgerStep{
			fetchStep(0, 0, 1), fetchStep(0, 1, 1),
			settleStep(0, 1, 0), settleStep(0, 1, 0),
			commitStep(1, noCommit),
			settleStep(0, 0, 2), settleStep(0, 0, 0),
			commitStep(1, map[int]int64{0: 2}),
			commitStep(1, noCommit),
		},
	}, {
		name: "partitions have their own prefixes",
		steps: []ledgerStep{
			fetchStep(0, 0, 1), fetchStep(1, 0, 1), fetchStep(0, 1, 1), fetchStep(1, 1, 1),
			settleStep(1, 0, 1), settleStep(0, 1, 0),
			commitStep(1, map[int]int64{1: 1}),
			settleStep(0, 0, 2),
			commitStep(1, map[int]int64{0: 2}),
		},
	}, {
		name: "a retried message holds its partition's prefix and its key",
		steps: []ledgerStep{
			fetchKeyStep(0, 0, 1, "k", false), fetchKeyStep(0, 1, 1, "j", false),
			blockStep(0, 0), // Retry of offset 0
			fetchKeyStep(0, 2, 1, "k", true), fetchKeyStep(0, 3, 1, "j", false),
			settleStep(0, 1, 0), settleStep(0, 3, 0),
			commitStep(1, noCommit),
			settleStep(0, 0, 2, 2), // hands 2 out; 2 is not settled yet
			commitStep(1, map[int]int64{0: 2}),
			// 2 now blocks the k messages fetched after it.
			fetchKeyStep(0, 4, 1, "k", true),
			settleStep(0, 2, 2, 4),
			settleStep(0, 4, 1),
			commitStep(1, map[int]int64{0: 5}),
			// No blocker of k is left: k is not held any more.
			fetchKeyStep(0, 5, 1, "k", false),
		},
	}, {
		name: "messages without a hold key are never held",
		steps: []ledgerStep{
			fetchStep(0, 0, 1),
			blockStep(0, 0),
			fetchStep(0, 1, 1),
			settleStep(0, 1, 0), settleStep(0, 0, 2),
			commitStep(1, map[int]int64{0: 2}),
		},
	}, {
		name: "a generation change fences off settles fetched before it",
		steps: []ledgerStep{
			fetchStep(0, 0, 1), fetchStep(0, 1, 1),
			settleStep(0, 0, 1), settleStep(0, 1, 1),
			// The group rebalanced (generation 2) before the request.
			commitStaleStep(2, noCommit, map[int]int64{0: 2}),
			// The partition's owner recommits; the fenced prefix is not
			// offered again.
			commitStep(2, noCommit),
			fetchStep(0, 2, 2),
			settleStep(0, 2, 1),
			commitStep(2, map[int]int64{0: 3}),
		},
	}, {
		name: "a prefix ending in the current generation is committed",
		steps: []ledgerStep{
			fetchStep(0, 0, 1), fetchStep(0, 1, 2),
			settleStep(0, 1, 0),
			settleStep(0, 0, 2),
			commitStep(2, map[int]int64{0: 2}),
		},
	}, {
		name: "a redelivered offset does not move the prefix back",
		steps: []ledgerStep{
			fetchStep(0, 0, 1), fetchStep(0, 1, 1),
			settleStep(0, 0, 1), settleStep(0, 1, 1),
			commitStep(1, map[int]int64{0: 2}),
			fetchStep(0, 1, 2), // the group redelivers offset 1
			settleStep(0, 1, 1),
			commitStep(2, noCommit),
			fetchStep(0, 2, 2),
			settleStep(0, 2, 1),
			commitStep(2, map[int]int64{0: 3}),
		},
	}, {
		name: "a failed commit request is offered again",
		steps: []ledgerStep{
			fetchStep(0, 0, 1), fetchStep(0, 1, 1), fetchStep(1, 0, 1),
			settleStep(0, 0, 1), settleStep(1, 0, 1),
			commitStep(1, map[int]int64{0: 1, 1: 1}),
			failStep(),
			commitStep(1, map[int]int64{0: 1, 1: 1}),
			settleStep(0, 1, 1),
			commitStep(1, map[int]int64{0: 2}),
		},
	}, {
		// 6 waited for a retry when generation 1 ended; its retry was
		// dropped. 5 (in flight) and 7 were settled with an effect. The
		// new generation fetches again from 5; no commit may pass 6 until
		// the new 6 settles, or a crash would lose it.
		name: "a dropped retry holds the commit below it until a later generation settles it",
		steps: []ledgerStep{
			fetchStep(0, 5, 1), fetchStep(0, 6, 1), fetchStep(0, 7, 1),
			dropStep(0, 6, 0),
			settleStep(0, 7, 0),
			settleStep(0, 5, 3),
			commitStaleStep(2, noCommit, map[int]int64{0: 6}),
			fetchStep(0, 5, 2), fetchStep(0, 6, 2), fetchStep(0, 7, 2),
			settleStep(0, 5, 1),
			commitStep(2, map[int]int64{0: 6}),
			settleStep(0, 6, 1),
			commitStep(2, map[int]int64{0: 8}),
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newLedgerRig(t)
			for i, s := range tt.steps {
				r.run(i, s)
			}
		})
	}
}

// TestLedgerDue checks that a redelivery timer hands out its message with
// every due message of its key, in offset order, and leaves the others
// waiting.
func TestLedgerDue(t *testing.T) {
	l := newLedger()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	entries := map[int64]*entry{}
	for _, off := range []int64{3, 4, 5, 6} {
		e := &entry{offset: off, gen: 1, holdKey: "k"}
		entries[off] = e
		l.record(ledgerTP(0), e)
	}
	// Redeliveries in the order the retries were asked for: 5, 3, 4, 6.
	for _, w := range []struct {
		off int64
		due time.Time
	}{{5, now}, {3, now.Add(-time.Second)}, {4, now.Add(time.Second)}, {6, now.Add(-time.Second)}} {
		e := entries[w.off]
		e.due = w.due
		l.block(e)
		l.wait(e)
	}
	l.unwait(entries[6]) // settled before its timer fired

	offsets := func(es []*entry) []int64 {
		var out []int64
		for _, e := range es {
			out = append(out, e.offset)
		}
		return out
	}
	if got := offsets(l.due(entries[5], now)); !slices.Equal(got, []int64{3, 5}) {
		t.Fatalf("due(5) = %v, want [3 5]: 5 and the earlier due 3, in offset order", got)
	}
	if got := offsets(l.due(entries[4], now.Add(time.Second))); !slices.Equal(got, []int64{4}) {
		t.Fatalf("due(4) = %v, want [4]: 3 and 5 were handed out already", got)
	}
	lone := &entry{offset: 9, gen: 1}
	l.record(ledgerTP(1), lone)
	if got := offsets(l.due(lone, now)); !slices.Equal(got, []int64{9}) {
		t.Fatalf("due of a message without a hold key = %v, want [9]", got)
	}
}

// TestLedgerCounts checks the numbers Stats and Lag read from the ledger.
func TestLedgerCounts(t *testing.T) {
	r := newLedgerRig(t)
	for i, s := range []ledgerStep{
		fetchKeyStep(0, 5, 1, "k", false), fetchKeyStep(0, 6, 1, "k", false),
		blockStep(0, 5),
		fetchKeyStep(0, 7, 1, "k", true),
		fetchStep(1, 0, 1), settleStep(1, 0, 1),
		fetchStep(2, 0, 1), settleStep(2, 0, 1), fetchStep(2, 1, 2),
		fetchStep(3, 0, 1),
	} {
		r.run(i, s)
	}
	if got := r.l.held(); got != 1 {
		t.Errorf("held = %d, want 1 (offset 7 behind 5)", got)
	}
	if got := r.l.uncommitted(); got != 5 {
		t.Errorf("uncommitted = %d, want 5 (0/5-7, 2/1, 3/0)", got)
	}
	if got, want := r.l.next(1), map[topicPartition]int64{ledgerTP(0): 5, ledgerTP(1): 1, ledgerTP(3): 0}; !maps.Equal(got, want) {
		t.Errorf("next(1) = %v, want %v (partition 2 was last fetched in generation 2)", got, want)
	}
	if got, want := r.l.next(2), map[topicPartition]int64{ledgerTP(2): 1}; !maps.Equal(got, want) {
		t.Errorf("next(2) = %v, want %v", got, want)
	}
}
