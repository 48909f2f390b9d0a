package checkout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq/consumer"
)

// WorkerConfig configures Run.
type WorkerConfig struct {
	// Broker carries the orders. Required.
	Broker Broker
	// Store holds the accounts, the ledger and the dedup records. Required.
	Store Store
	// Name is the consumer's name, the scope of its dedup records.
	// Defaults to "checkout".
	Name string
	// Concurrency is the runner's Concurrency. Defaults to 4.
	Concurrency int
	// BatchSize is the runner's BatchSize: orders per transaction.
	// Defaults to 20.
	BatchSize int
	// Idle makes Run return once no order arrived for this long. Zero
	// means run until ctx is done.
	Idle time.Duration
	// Report, if set, is called with the runner's counters every
	// ReportInterval and once more when Run returns. Defaults to nil.
	Report func(consumer.Stats)
	// ReportInterval is how often Report is called. Defaults to 1 s.
	ReportInterval time.Duration
	// Logger receives the runner's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Hooks observe the runner (consumer.Config.Hooks). Defaults to none.
	Hooks []consumer.Hook
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c WorkerConfig) WithDefaults() WorkerConfig {
	if c.Name == "" {
		c.Name = "checkout"
	}
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.BatchSize == 0 {
		c.BatchSize = 20
	}
	if c.ReportInterval == 0 {
		c.ReportInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// RunnerConfig returns the consumer configuration Run uses (after
// WithDefaults): short retry backoffs (50 ms to 2 s) and a 10 s drain.
func (c WorkerConfig) RunnerConfig() consumer.Config {
	c = c.WithDefaults()
	return consumer.Config{
		Name:         c.Name,
		Concurrency:  c.Concurrency,
		BatchSize:    c.BatchSize,
		DrainTimeout: 10 * time.Second,
		Retry:        consumer.RetryPolicy{InitialBackoff: 50 * time.Millisecond, MaxBackoff: 2 * time.Second},
		Logger:       c.Logger,
		Hooks:        c.Hooks,
	}
}

// Run runs the checkout worker: it consumes orders from cfg.Broker and
// charges each one exactly once in effect into cfg.Store, until ctx is done
// (then it drains: in-flight orders are committed and acknowledged) or the
// broker was idle for cfg.Idle. It returns the runner's counters.
func Run(ctx context.Context, cfg WorkerConfig) (consumer.Stats, error) {
	cfg = cfg.WithDefaults()
	if cfg.Broker == nil || cfg.Store == nil {
		return consumer.Stats{}, errors.New("checkout: WorkerConfig needs a Broker and a Store")
	}
	rc := cfg.RunnerConfig()
	src, err := cfg.Broker.Source(ctx, &rc)
	if err != nil {
		return consumer.Stats{}, fmt.Errorf("checkout: open source: %w", err)
	}
	defer src.Close()
	runner, err := consumer.NewRunner(src, cfg.Store.Path(), rc)
	if err != nil {
		return consumer.Stats{}, err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()

	tick := time.NewTicker(min(cfg.ReportInterval, 100*time.Millisecond))
	defer tick.Stop()
	var lastReceived uint64
	lastChange, lastReport := time.Now(), time.Now()
	for {
		select {
		case err := <-done:
			st := runner.Stats()
			if cfg.Report != nil {
				cfg.Report(st)
			}
			return st, err
		case now := <-tick.C:
			st := runner.Stats()
			if st.Received != lastReceived {
				lastReceived, lastChange = st.Received, now
			} else if cfg.Idle > 0 && now.Sub(lastChange) >= cfg.Idle {
				stop()
			}
			if cfg.Report != nil && now.Sub(lastReport) >= cfg.ReportInterval {
				cfg.Report(st)
				lastReport = now
			}
		}
	}
}
