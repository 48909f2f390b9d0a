package main

import (
	"fmt"
	"time"

	"github.com/idemq/idemq/cmd/internal/bench/pgload"
)

// report prints the layouts side by side and checks the goals of each
// filled layout against the empty table.
func report(o options, rs []*result) {
	fmt.Printf("\n%-12s %11s %9s %9s %9s %9s %10s %10s %11s %12s %13s %10s %10s %10s\n",
		"layout", "records", "claims/s", "claim p50", "claim p99", "claim max", "WAL/claim", "heap B/rec", "index B/rec",
		"day retention", "claim max ret", "heap after", "idx after", "dead after")
	empties := map[string]*result{}
	for _, r := range rs {
		if !layoutKinds[r.name] {
			empties[r.name] = r
		}
		lat := pgload.Durations(r.claimLat)
		ret, retMax := retention(r)
		fmt.Printf("%-12s %11d %9.0f %9s %9s %9s %10.0f %10.1f %11.1f %12s %13s %10s %10s %10d\n",
			r.name, r.filled, r.rate(), pgload.Ms(pgload.Pct(lat, 0.5)), pgload.Ms(pgload.Pct(lat, 0.99)), pgload.Ms(pgload.Pct(lat, 1)),
			float64(r.wal)/float64(max(r.claims, 1)), perRecord(r.fill.Table, r.filled), perRecord(r.fill.Indexes, r.filled),
			ret, retMax, pgload.MiB(r.after.Table), pgload.MiB(r.after.Indexes), r.after.Dead)
	}
	fmt.Printf("(records: filled before the run, or the run's claims for the empty table; B/rec: bytes per record after the fill; day retention: the slowest day's removal, from the janitor's first transaction after its rollover to the commit that removed its last records; claim max ret: the claims' max latency during the removals; after: after the run and its %d rollovers)\n", o.cycles)
	for _, r := range rs {
		if !layoutKinds[r.name] {
			continue
		}
		fmt.Printf("\ngoals at %d records, %s:\n", r.filled, r.name)
		lat := pgload.Durations(r.claimLat)
		bases := []string{"empty"}
		if r.name == "partitioned" {
			bases = append(bases, "partitioned-empty")
		}
		for _, base := range bases {
			e, ok := empties[base]
			if !ok {
				fmt.Printf("  claims/s and claim p99 against %s: not measured (not in -layouts)\n", base)
				continue
			}
			ratio := r.rate() / e.rate()
			check(fmt.Sprintf("claims/s %.0f vs %s %.0f = %.2fx", r.rate(), base, e.rate(), ratio), ">= 0.9x", ratio >= 0.9)
			p99, e99 := pgload.Pct(lat, 0.99), pgload.Pct(pgload.Durations(e.claimLat), 0.99)
			ratio = float64(p99) / float64(e99)
			check(fmt.Sprintf("claim p99 %s vs %s %s = %.2fx", pgload.Ms(p99), base, pgload.Ms(e99), ratio), "<= 1.2x", ratio <= 1.2)
		}
		slowest, all := slowestRetention(r)
		if all {
			check(fmt.Sprintf("a day's retention (%d records): slowest of %d took %.2f s", r.filled/int64(o.days), len(r.cycles), slowest.Seconds()), "< 1 s", slowest < time.Second)
		} else {
			check(fmt.Sprintf("a day's retention (%d records): not every day gone by the end of the run", r.filled/int64(o.days)), "< 1 s", false)
		}
		check(fmt.Sprintf("dead tuples after %d rollovers: %d", len(r.cycles), r.after.Dead), "0", r.after.Dead == 0)
		heap := perRecord(r.fill.Table, r.filled)
		check(fmt.Sprintf("storage per record: heap %.1f bytes + indexes %.1f bytes = %.1f bytes", heap, perRecord(r.fill.Indexes, r.filled),
			perRecord(r.fill.Table+r.fill.Indexes, r.filled)), "heap <= 100 bytes", heap <= 100)
	}
}

func check(what, goal string, ok bool) {
	verdict := "not met"
	if ok {
		verdict = "met"
	}
	fmt.Printf("  %-92s goal %-18s %s\n", what, goal, verdict)
}

func perRecord(bytes, records int64) float64 {
	if records == 0 {
		return 0
	}
	return float64(bytes) / float64(records)
}

// retention formats the slowest day's retention and the claims' max
// latency over every retention.
func retention(r *result) (slowest, claimMax string) {
	if len(r.cycles) == 0 {
		return "-", "-"
	}
	d, all := slowestRetention(r)
	slowest = fmt.Sprintf("%.2f s", d.Seconds())
	if !all {
		slowest = "> " + slowest
	}
	var lat []time.Duration
	for _, c := range r.cycles {
		if !c.done.IsZero() {
			lat = append(lat, window(r.claimLat, c.started, c.done)...)
		}
	}
	return slowest, pgload.Ms(pgload.Pct(lat, 1))
}

// slowestRetention returns the longest time the janitor took to remove a
// rolled-over day, from its first transaction after the rollover to the
// commit that removed the day's last records (for a day never gone, from
// the rollover to the end of the run), and whether every day went.
func slowestRetention(r *result) (time.Duration, bool) {
	var slowest time.Duration
	all := true
	for _, c := range r.cycles {
		from, end := c.started, c.done
		if end.IsZero() {
			all, from, end = false, c.at, r.start.Add(r.d)
		}
		slowest = max(slowest, end.Sub(from))
	}
	return slowest, all
}
