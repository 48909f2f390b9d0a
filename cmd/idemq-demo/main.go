// Command idemq-demo is the zero-setup demo that `make demo` runs: the
// checkout worker (cmd/idemq-demo/internal/checkout) under chaos on an in-process Kafka
// cluster and a SQLite file, killed and restarted, its events through the
// outbox to a notifier, then the proof that every order was charged and
// notified exactly once (cmd/idemq-demo/internal/demo).
//
//	idemq-demo [--messages 2000 --kills 4 --seed 1]
//	idemq-demo --broker kafka --kafka 127.0.0.1:9092 --store postgres --db URL
//	idemq-demo checkout -broker rabbitmq -store postgres -publish 1000 -idle 3s
//
// "idemq-demo checkout" runs the same worker on any broker and store
// without the chaos (checkout.go).
// It is a program of its own so that the operations command (cmd/idemq)
// does not link the demo's in-process broker. The demo starts its workers as
// "idemq-demo worker ..." (this executable). Exit status: 0 when the proof
// holds, 1 when it does not or the run failed, 2 for a usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/cmd/idemq-demo/internal/demo"
	"github.com/idemq/idemq/internal/redact"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// errUsage marks an error caused by the command line.
var errUsage = errors.New("usage")

// workerArg is the first argument with which the demo starts its workers.
const workerArg = "worker"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case len(args) > 0 && args[0] == workerArg: // started by the demo's supervisor
		err = runWorker(ctx, args[1:], stdout)
	case len(args) > 0 && args[0] == checkoutArg:
		err = runCheckout(ctx, args[1:], stdout, stderr)
	default:
		err = runDemo(ctx, args, stdout, stderr)
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "idemq-demo: %s\nRun 'idemq-demo -h' for the flags.\n", scrub(err))
		return exitUsage
	default:
		fmt.Fprintf(stderr, "idemq-demo: %s\n", scrub(err))
		return exitFailure
	}
}

// databaseURLEnv are the environment variables the --db default comes from.
var databaseURLEnv = []string{"DATABASE_URL", "TEST_DATABASE_URL"}

// dbURL is the --db value of the run, for scrub.
var dbURL string

// scrub returns err's text with the secrets of the PostgreSQL URLs masked:
// drivers quote database names and passwords, and the workers report theirs.
func scrub(err error) string {
	dsns := []string{dbURL}
	for _, n := range databaseURLEnv {
		dsns = append(dsns, os.Getenv(n))
	}
	return redact.ScrubDSN(err.Error(), dsns...)
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("idemq-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: idemq-demo [flags]\n\nRun the checkout worker under chaos (in-process Kafka, SQLite) and prove every order was charged once.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var cfg demo.Config
	var kafka string
	fs.IntVar(&cfg.Messages, "messages", demo.DefaultMessages, "distinct orders the chaos producer sends")
	fs.IntVar(&cfg.Kills, "kills", demo.DefaultKills, "times the worker is killed with SIGKILL and restarted (negative: none)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of every random choice; the same seed plays the same chaos")
	fs.Float64Var(&cfg.DuplicateRate, "duplicates", demo.DefaultDuplicateRate, "fraction of orders the producer sends twice")
	fs.IntVar(&cfg.BadOrders, "bad", demo.DefaultBadOrders, "malformed orders (dead-lettered)")
	fs.Float64Var(&cfg.DropAcks, "drop-acks", demo.DefaultDropAcks, "fraction of acks the workers lose before their last life (negative: none)")
	fs.StringVar(&cfg.Broker, "broker", demo.BrokerKfake, "kfake (in-process Kafka), kafka (real, see --kafka) or memory")
	fs.StringVar(&kafka, "kafka", env("127.0.0.1:9092", "KAFKA_BROKERS", "TEST_KAFKA_BROKERS"), "Kafka bootstrap brokers for --broker kafka")
	fs.StringVar(&cfg.Store, "store", demo.StoreSQLite, "sqlite or postgres (see --db)")
	fs.StringVar(&cfg.SQLitePath, "sqlite", "", "SQLite file to keep (default: a temporary file, removed at the end)")
	dbURL = env("postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable", databaseURLEnv...)
	fs.Var(urlValue{&dbURL}, "db", "PostgreSQL `URL` for --store postgres; $DATABASE_URL if set (the default is shown redacted)")
	fs.DurationVar(&cfg.Timeout, "timeout", demo.DefaultTimeout, "give up after this long")
	fs.BoolVar(&cfg.Verbose, "v", false, "show the workers' logs")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	cfg.KafkaBrokers = strings.Split(kafka, ",")
	if cfg.Store == demo.StorePostgres {
		cfg.DatabaseURL = dbURL
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this program to start workers: %w", err)
	}
	cfg.WorkerCommand = []string{exe, workerArg}
	cfg.Out = stdout
	sum, err := demo.Run(ctx, cfg)
	if errors.Is(err, demo.ErrConfig) {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if err != nil {
		if sum.Sent > 0 {
			sum.Print(stdout)
		}
		return err
	}
	sum.Print(stdout)
	return sum.Check()
}

func runWorker(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := demo.ParseWorkerFlags(args)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return demo.RunWorker(ctx, o, stdout)
}

// urlValue is a flag holding a URL: help text shows its default redacted.
type urlValue struct{ s *string }

func (v urlValue) String() string {
	if v.s == nil {
		return ""
	}
	return redact.DSN(*v.s)
}

func (v urlValue) Set(s string) error { *v.s = s; return nil }

// env returns the first non-empty environment variable of names, else def.
func env(def string, names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return def
}
