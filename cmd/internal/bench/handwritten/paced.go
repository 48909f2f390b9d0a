package handwritten

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/consumer"
)

// LatencyConfig is a runner configuration of a latency mode.
type LatencyConfig struct {
	Name  string
	Batch int  // consumer.Config.BatchSize
	API   bool // TransactionalBatch, else Transactional
}

// LatencyConfigs are the runner configurations of the brokers' latency
// modes, in round 1's order: the default config, batch 1, and the batch API
// at batch 100.
var LatencyConfigs = []LatencyConfig{
	{Name: "default config"},
	{Name: "batch 1", Batch: 1},
	{Name: "batch API, batch 100", Batch: 100, API: true},
}

// Paced is what one paced run measured: the latencies of the paced
// messages, how many were sent, and how long sending them took.
type Paced struct {
	Lat  *Latency
	Sent int
	D    time.Duration
}

// LatencyTable runs, for each rate of rates (comma-separated messages per
// second) and each of rounds rounds, run for every configuration of
// LatencyConfigs (in reverse order in even rounds), and prints a table: the
// rate, the configuration, the messages measured, the send rate, and the
// p50 and p99 of receipt-to-ack and of send-to-ack. Each row is followed by
// the lines its run noted (FlushNotes).
func LatencyTable(rates string, rounds int, run func(rate, round int, c LatencyConfig) (Paced, error)) error {
	fmt.Printf("%-8s %-44s %8s %10s %10s %10s %10s %10s\n", "rate", "config", "messages", "msg/s", "p50", "p99", "sent p50", "sent p99")
	for f := range strings.SplitSeq(rates, ",") {
		rate, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || rate <= 0 {
			return fmt.Errorf("-rates: bad rate %q", f)
		}
		for round := 1; round <= rounds; round++ {
			order := slices.Clone(LatencyConfigs)
			if round%2 == 0 {
				slices.Reverse(order)
			}
			for _, c := range order {
				p, err := run(rate, round, c)
				if err != nil {
					return fmt.Errorf("rate %d, %s: %w", rate, c.Name, err)
				}
				n, p50, p99 := p.Lat.Percentiles()
				_, s50, s99 := p.Lat.SentPercentiles()
				fmt.Printf("%-8d %-44s %8d %10.0f %9.2fms %9.2fms %9.2fms %9.2fms\n", rate, c.Name, n, float64(p.Sent)/p.D.Seconds(),
					ms(p50), ms(p99), ms(s50), ms(s99))
				FlushNotes()
			}
		}
	}
	return nil
}

// Pace warms r up and then sends at rate: it sends warm messages (send(0,
// warm)), waits until r has handled them and then for settle, resets lat,
// and then every millisecond sends the messages due since it started
// (send(from, n), from counting on after the warm-up) until total-warm are
// sent. It returns the paced run.
func Pace(ctx context.Context, r *consumer.Runner, lat *Latency, rate, warm, total int, settle time.Duration, send func(from, n int) error) (Paced, error) {
	p := Paced{Lat: lat}
	if err := send(0, warm); err != nil {
		return p, err
	}
	for r.Stats().Handled < uint64(warm) {
		if ctx.Err() != nil {
			return p, ctx.Err()
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(settle)
	lat.Reset()
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for p.Sent < total-warm {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return p, ctx.Err()
		}
		due := min(total-warm, int(time.Since(start).Seconds()*float64(rate)))
		if due > p.Sent {
			if err := send(warm+p.Sent, due-p.Sent); err != nil {
				return p, err
			}
			p.Sent = due
		}
	}
	p.D = time.Since(start)
	return p, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
