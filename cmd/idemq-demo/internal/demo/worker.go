package demo

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/cmd/idemq-demo/internal/checkout"
	"github.com/idemq/idemq/consumer"
)

// WorkerOptions configure one worker process of the demo: the checkout worker
// on the broker and store the supervisor set up.
type WorkerOptions struct {
	Broker       string // the broker kind; worker processes run on Kafka (kfake or real)
	KafkaBrokers string
	Topic        string
	Group        string
	Store        string
	SQLitePath   string
	DatabaseURL  string
	Schema       string
	Accounts     int
	// SessionTimeout is the Kafka consumer group session timeout.
	SessionTimeout time.Duration
	// DropAcks is the probability that the worker "loses" an
	// acknowledgement (as a crash between commit and ack would): the
	// message is never acknowledged, so the broker delivers it again after
	// the next kill, and the runner recognises it as a duplicate.
	DropAcks float64
	// Seed seeds the lost acknowledgements.
	Seed uint64
	// Verbose logs the runner and the source to stderr.
	Verbose bool
	// Events is the destination of the "order charged" events each charge
	// publishes through the outbox (checkout.EnableEvents); "" for none.
	Events string
}

// WorkerDatabaseEnv is the environment variable that hands a worker process
// its PostgreSQL URL: a command line is visible to every user of the
// machine (ps), the environment is not.
const WorkerDatabaseEnv = "IDEMQ_DEMO_DATABASE_URL"

// env returns the environment entries that carry o's secrets.
func (o WorkerOptions) env() []string {
	return []string{WorkerDatabaseEnv + "=" + o.DatabaseURL}
}

// args renders o, except the secrets env carries, as the command-line flags
// ParseWorkerFlags reads.
func (o WorkerOptions) args() []string {
	return []string{
		"-broker", o.Broker, "-kafka", o.KafkaBrokers, "-topic", o.Topic, "-group", o.Group,
		"-store", o.Store, "-sqlite", o.SQLitePath, "-schema", o.Schema,
		"-accounts", fmt.Sprint(o.Accounts), "-session-timeout", o.SessionTimeout.String(),
		"-drop-acks", fmt.Sprint(o.DropAcks), "-seed", fmt.Sprint(o.Seed), fmt.Sprintf("-v=%v", o.Verbose),
		"-events", o.Events,
	}
}

// ParseWorkerFlags parses the flags the supervisor passes to a worker process.
func ParseWorkerFlags(args []string) (WorkerOptions, error) {
	var o WorkerOptions
	fs := flag.NewFlagSet("demo worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.Broker, "broker", checkout.BrokerKafka, "")
	fs.StringVar(&o.KafkaBrokers, "kafka", "", "")
	fs.StringVar(&o.Topic, "topic", "", "")
	fs.StringVar(&o.Group, "group", "", "")
	fs.StringVar(&o.Store, "store", StoreSQLite, "")
	fs.StringVar(&o.SQLitePath, "sqlite", "", "")
	fs.StringVar(&o.DatabaseURL, "db", os.Getenv(WorkerDatabaseEnv), "")
	fs.StringVar(&o.Schema, "schema", "", "")
	fs.IntVar(&o.Accounts, "accounts", DefaultAccounts, "")
	fs.DurationVar(&o.SessionTimeout, "session-timeout", 0, "")
	fs.Float64Var(&o.DropAcks, "drop-acks", 0, "")
	fs.Uint64Var(&o.Seed, "seed", 1, "")
	fs.BoolVar(&o.Verbose, "v", false, "")
	fs.StringVar(&o.Events, "events", "", "")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("demo worker: %w", err)
	}
	return o, nil
}

// report is the line a worker process prints on stdout, every
// reportInterval and when it stops, for the supervisor's summary.
type report struct {
	Received     uint64 `json:"received"`
	Handled      uint64 `json:"handled"`
	Duplicates   uint64 `json:"duplicates"`
	Retried      uint64 `json:"retried"`
	DeadLettered uint64 `json:"dead_lettered"`
	DroppedAcks  uint64 `json:"dropped_acks"`
	// What the worker's metricsHook saw.
	DupRedelivery uint64    `json:"dup_redelivery"`
	DupConcurrent uint64    `json:"dup_concurrent"`
	DupProducer   uint64    `json:"dup_producer"`
	Handler       histogram `json:"handler_buckets"`
	Commit        histogram `json:"commit_buckets"`
}

const reportInterval = 10 * time.Millisecond

// RunWorker runs one worker process until ctx is done (the supervisor sends
// SIGTERM at the end; a kill is a SIGKILL and needs no code). It prints a
// JSON report line to out every 10 ms and when it stops.
func RunWorker(ctx context.Context, o WorkerOptions, out io.Writer) error {
	logger := slog.New(slog.DiscardHandler)
	if o.Verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	store, err := openStore(ctx, o.Store, o.SQLitePath, o.DatabaseURL, o.Schema, o.Accounts)
	if err != nil {
		return err
	}
	defer store.Close()
	if o.Events != "" {
		if err := checkout.EnableEvents(ctx, store, o.Events); err != nil {
			return err
		}
	}
	b, err := checkout.OpenBroker(ctx, checkout.BrokerConfig{
		Kind: o.Broker, KafkaBrokers: strings.Split(o.KafkaBrokers, ","), Topic: o.Topic, Group: o.Group,
		KafkaSessionTimeout: o.SessionTimeout, KafkaRebalanceTimeout: 2 * o.SessionTimeout, Logger: logger,
	})
	if err != nil {
		return err
	}
	defer b.Close()
	lossy := &lossyBroker{Broker: b, p: o.DropAcks, rng: rand.New(rand.NewPCG(o.Seed, 0x1de))}
	enc := json.NewEncoder(out)
	var mu sync.Mutex
	hook := newMetricsHook()
	_, err = checkout.Run(ctx, checkout.WorkerConfig{
		Broker: lossy, Store: store, Concurrency: 4, BatchSize: 25, Logger: logger,
		Hooks:          []consumer.Hook{hook},
		ReportInterval: reportInterval,
		Report: func(st consumer.Stats) {
			mu.Lock()
			defer mu.Unlock()
			r := report{Received: st.Received, Handled: st.Handled, Duplicates: st.Duplicates,
				Retried: st.Retried, DeadLettered: st.DeadLettered, DroppedAcks: lossy.dropped.Load()}
			hook.fill(&r)
			_ = enc.Encode(r)
		},
	})
	return err
}

func openStore(ctx context.Context, kind, sqlitePath, databaseURL, schema string, accounts int) (checkout.Store, error) {
	switch kind {
	case StoreSQLite:
		return checkout.OpenSQLite(ctx, sqlitePath, accounts)
	case StorePostgres:
		return checkout.OpenPostgres(ctx, databaseURL, schema, accounts)
	}
	return nil, fmt.Errorf("%w: unknown store %q (want %s or %s)", ErrConfig, kind, StoreSQLite, StorePostgres)
}

// lossyBroker opens sources that lose a fraction of their acknowledgements.
type lossyBroker struct {
	checkout.Broker
	p       float64
	mu      sync.Mutex
	rng     *rand.Rand
	dropped atomic.Uint64
}

func (b *lossyBroker) Source(ctx context.Context, rc *consumer.Config) (consumer.Source, error) {
	src, err := b.Broker.Source(ctx, rc)
	if err != nil || b.p <= 0 {
		return src, err
	}
	return &lossySource{Source: src, b: b}, nil
}

// lossySource drops the acknowledgement of a random fraction of messages,
// like a worker that crashed between its commit and its ack. On Kafka an
// unacknowledged message holds back the partition's committed offset, so
// everything after it is delivered again after the next kill.
type lossySource struct {
	consumer.Source
	b *lossyBroker
}

func (s *lossySource) Ack(ctx context.Context, msgs []*consumer.Message) error {
	keep := msgs[:0:0]
	s.b.mu.Lock()
	for _, m := range msgs {
		if s.b.rng.Float64() < s.b.p {
			s.b.dropped.Add(1)
			continue
		}
		keep = append(keep, m)
	}
	s.b.mu.Unlock()
	if len(keep) == 0 {
		return nil
	}
	return s.Source.Ack(ctx, keep)
}

// errWorkerExited reports a worker process that ended on its own.
var errWorkerExited = errors.New("demo: worker process exited")
