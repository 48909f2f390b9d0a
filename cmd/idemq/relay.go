package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/kafkaoutbox"
	"github.com/idemq/idemq/sinks/outbox/sqsoutbox"
	"github.com/idemq/idemq/sources/sqssource"
)

// relayCommand is the relay's entry in the command table.
func relayCommand() command {
	return command{
		name:    "relay",
		args:    "[unpark ID...|unpark --all]",
		summary: "publish the committed rows of the outbox table (sinks/outbox) to a broker (--broker), show their counts and errors (--stats), or retry parked rows (unpark)",
		run:     runRelay,
	}
}

// openOutboxDB opens a pgx pool (PostgreSQL) or a *sql.DB (SQLite); see
// openMode.
func openOutboxDB(ctx context.Context, dialect sqldedup.Dialect, source string, mode openMode) (any, func(), error) {
	if dialect == sqldedup.SQLite {
		db, err := openSQLite(ctx, source, mode, outboxTable)
		if err != nil {
			return nil, nil, err
		}
		return db, func() { db.Close() }, nil
	}
	pool, err := pgxpool.New(ctx, source)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	return pool, pool.Close, nil
}

func runRelay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("relay", stderr)
	dsn, sqsEndpoint, amqpURL := new(string), new(string), new(string)
	dsnVar(fs, dsn, "dsn", os.Getenv("IDEMQ_DSN"), "database with the outbox table: postgres://... URL or sqlite:FILE; $IDEMQ_DSN if set (a default is shown redacted)")
	broker := fs.String("broker", "", "kafka, sqs or rabbitmq")
	brokers := fs.String("brokers", env("127.0.0.1:9092", "IDEMQ_KAFKA_BROKERS"), "Kafka bootstrap addresses, comma-separated; env IDEMQ_KAFKA_BROKERS")
	dsnVar(fs, sqsEndpoint, "sqs-endpoint", os.Getenv("IDEMQ_SQS_ENDPOINT"), "SQS endpoint `URL`, for ElasticMQ or LocalStack (env IDEMQ_SQS_ENDPOINT; empty: the AWS configuration)")
	dsnVar(fs, amqpURL, "amqp-url", env("amqp://guest:guest@127.0.0.1:5672/", "IDEMQ_AMQP_URL"), "RabbitMQ `URL`; env IDEMQ_AMQP_URL (the default is shown redacted)")
	stats := fs.Bool("stats", false, "print the outbox's row counts (pending, failing, sent, parked) and the failed rows by destination and error, and exit")
	asJSON := fs.Bool("json", false, "--stats, unpark: print JSON for scripts")
	all := fs.Bool("all", false, "unpark: every parked row")
	dryRun := fs.Bool("dry-run", false, "unpark: list the rows that would be unparked, and change nothing")
	var cfg outbox.Config
	fs.IntVar(&cfg.BatchSize, "batch", 100, "rows claimed and published at once")
	fs.IntVar(&cfg.Concurrency, "concurrency", 1, "batches in flight at once (PostgreSQL only)")
	fs.DurationVar(&cfg.PollInterval, "poll", time.Second, "poll interval (the fallback of LISTEN/NOTIFY on PostgreSQL)")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", 10, "failed publishes after which a row is parked")
	fs.DurationVar(&cfg.Retention, "retention", 24*time.Hour, "how long sent rows are kept; negative deletes them when sent")
	fs.DurationVar(&cfg.FailureReminder, "failure-reminder", time.Minute, "least time between two log lines about one destination's failed publishes")
	fs.StringVar((*string)(&cfg.Schema), "schema", "", "PostgreSQL schema of the outbox table (default: the first of the search path)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	unpark := len(pos) > 0 && pos[0] == "unpark"
	var ids []string
	switch {
	case unpark:
		ids = pos[1:]
	case len(pos) > 0:
		return fmt.Errorf("%w: unexpected arguments %q (the only subcommand is unpark)", errUsage, pos)
	}
	switch {
	case unpark && *stats:
		return fmt.Errorf("%w: unpark and --stats are separate commands", errUsage)
	case unpark && *all && len(ids) > 0:
		return fmt.Errorf("%w: unpark takes IDs or --all, not both", errUsage)
	case unpark && !*all && len(ids) == 0:
		return fmt.Errorf("%w: which rows? unpark takes the IDs of parked rows (idemq relay --stats shows them), or --all", errUsage)
	case !unpark && (*all || *dryRun):
		return fmt.Errorf("%w: --all and --dry-run are for unpark", errUsage)
	case *asJSON && !unpark && !*stats:
		return fmt.Errorf("%w: --json is for --stats and unpark", errUsage)
	}
	dialect, source, err := dialectOf(*dsn)
	if err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))

	var pub outbox.Publisher
	switch {
	case *stats || unpark:
		pub = noPublisher{}
	case *broker == "kafka":
		p, err := kafkaoutbox.New(kafkaoutbox.Config{Brokers: strings.Split(*brokers, ",")})
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		defer p.Close()
		pub = p
	case *broker == "sqs":
		c, err := sqssource.NewClient(ctx, *sqsEndpoint)
		if err != nil {
			return err
		}
		if pub, err = sqsoutbox.New(c); err != nil {
			return err
		}
	case *broker == "rabbitmq":
		p, err := amqpoutbox.New(amqpoutbox.Config{URL: *amqpURL})
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		defer p.Close()
		pub = p
	default:
		return fmt.Errorf("%w: --broker must be kafka, sqs or rabbitmq, not %q", errUsage, *broker)
	}

	db, closeDB, err := openOutboxDB(ctx, dialect, source, existingDB)
	if err != nil {
		return err
	}
	defer closeDB()
	var r *outbox.Relay
	switch d := db.(type) {
	case *pgxpool.Pool:
		r, err = outbox.NewRelay(d, pub, cfg)
	case *sql.DB:
		r, err = outbox.NewSQLiteRelay(d, pub, cfg)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	switch {
	case *stats:
		return noTable(relayStats(ctx, r, *asJSON, stdout), outboxTable)
	case unpark:
		return noTable(relayUnpark(ctx, r, ids, *dryRun, *asJSON, stdout), outboxTable)
	}
	fmt.Fprintf(stderr, "idemq relay: publishing %s rows to %s; Ctrl-C stops\n", outbox.Table, *broker)
	return r.Run(ctx)
}

// maxFailureGroups bounds the groups of failed rows `idemq relay --stats`
// shows.
const maxFailureGroups = 20

// relayStatsJSON is the output of `idemq relay --stats --json`.
type relayStatsJSON struct {
	Pending int64 `json:"pending"`
	// Failing counts the pending rows whose last publish failed.
	Failing              int64         `json:"failing"`
	Sent                 int64         `json:"sent"`
	Parked               int64         `json:"parked"`
	OldestPendingSeconds float64       `json:"oldest_pending_seconds"`
	Failures             []failureJSON `json:"failures"`
}

// failureJSON is an outbox.FailureGroup in JSON.
type failureJSON struct {
	Destination string `json:"destination"`
	RoutingKey  string `json:"routing_key,omitempty"`
	Error       string `json:"error"`
	Failing     int64  `json:"failing"`
	Parked      int64  `json:"parked"`
	LastID      string `json:"last_id"`
}

// relayStats prints the outbox's counts and its failed rows, grouped.
func relayStats(ctx context.Context, r *outbox.Relay, asJSON bool, w io.Writer) error {
	c, err := r.Counts(ctx)
	if err != nil {
		return err
	}
	groups, err := r.Failures(ctx, maxFailureGroups)
	if err != nil {
		return err
	}
	if asJSON {
		out := relayStatsJSON{Pending: c.Pending, Failing: c.Failing, Sent: c.Sent, Parked: c.Parked,
			OldestPendingSeconds: c.OldestPending.Seconds(), Failures: []failureJSON{}}
		for _, g := range groups {
			out.Failures = append(out.Failures, failureJSON(g))
		}
		return writeJSON(w, out)
	}
	fmt.Fprintf(w, "pending         %d\n", c.Pending)
	fmt.Fprintf(w, "  failing       %d (their last publish failed; they wait for their next attempt)\n", c.Failing)
	fmt.Fprintf(w, "sent            %d\n", c.Sent)
	fmt.Fprintf(w, "parked          %d\n", c.Parked)
	fmt.Fprintf(w, "oldest pending  %s\n", c.OldestPending.Round(time.Millisecond))
	if len(groups) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nrows not sent, by destination and last error (at most %d groups, largest first):\n", maxFailureGroups)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FAILING\tPARKED\tDESTINATION\tLAST ID\tLAST ERROR")
	for _, g := range groups {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\n", g.Failing, g.Parked, destination(g.Destination, g.RoutingKey), g.LastID, oneLine(g.Error, 120))
	}
	_ = tw.Flush()
	if c.Parked > 0 {
		fmt.Fprintln(w, "\nidemq relay unpark ID... (or --all) puts parked rows back to pending.")
	}
	return nil
}

// destination shows a row's destination, quoted ("" is RabbitMQ's
// default exchange), and its routing key when it has one.
func destination(dest, routingKey string) string {
	s := strconv.Quote(dest)
	if routingKey != "" {
		s += " routing key " + strconv.Quote(routingKey)
	}
	return s
}

// unparkJSON is the output of `idemq relay unpark --json`.
type unparkJSON struct {
	DryRun bool `json:"dry_run"`
	// Unparked is the number of rows put back to pending (0 in a dry run).
	Unparked int64 `json:"unparked"`
	// Rows are the parked rows selected, as they were before.
	Rows []parkedJSON `json:"rows"`
}

// parkedJSON is an outbox.ParkedRow in JSON.
type parkedJSON struct {
	ID          string    `json:"id"`
	Destination string    `json:"destination"`
	RoutingKey  string    `json:"routing_key,omitempty"`
	Key         string    `json:"key"`
	Attempts    int       `json:"attempts"`
	LastError   string    `json:"last_error"`
	Created     time.Time `json:"created_at"`
}

// relayUnpark puts the parked rows of ids (every parked row when ids is
// empty) back to pending, or lists them with dryRun. It changes nothing
// when an id names no parked row.
func relayUnpark(ctx context.Context, r *outbox.Relay, ids []string, dryRun, asJSON bool, w io.Writer) error {
	rows, err := r.Parked(ctx, ids, 0)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		found := map[string]bool{}
		for _, p := range rows {
			found[p.ID] = true
		}
		var missing []string
		for _, id := range ids {
			if !found[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no parked row with id %s (no such row, or it is not parked): nothing changed", strings.Join(missing, ", "))
		}
	}
	var n int64
	if !dryRun {
		if len(ids) > 0 {
			n, err = r.Unpark(ctx, ids...)
		} else {
			n, err = r.UnparkAll(ctx)
		}
		if err != nil {
			return err
		}
	}
	if asJSON {
		out := unparkJSON{DryRun: dryRun, Unparked: n, Rows: []parkedJSON{}}
		for _, p := range rows {
			p.Created = p.Created.UTC()
			out.Rows = append(out.Rows, parkedJSON(p))
		}
		return writeJSON(w, out)
	}
	if dryRun {
		fmt.Fprintf(w, "dry run, nothing changed: would unpark %s:\n", plural(int64(len(rows)), "row"))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tDESTINATION\tKEY\tATTEMPTS\tLAST ERROR")
		for _, p := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", p.ID, destination(p.Destination, p.RoutingKey), orDash(p.Key), p.Attempts, oneLine(p.LastError, 120))
		}
		return tw.Flush()
	}
	fmt.Fprintf(w, "unparked %s: pending again, with no attempt counted; the relay publishes them again\n", plural(n, "row"))
	return nil
}

// noPublisher is the publisher of `idemq relay --stats` and `idemq relay
// unpark`, which publish nothing.
type noPublisher struct{}

func (noPublisher) Publish(context.Context, []outbox.Message) error {
	return fmt.Errorf("%w: --stats and unpark publish nothing", outbox.ErrUnavailable)
}
