package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/demo"
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

type command struct {
	name, args, summary string
	run                 func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	hidden              bool
}

func commands() []command {
	return []command{
		{name: "demo", args: "[flags]", summary: "run the checkout worker under chaos (in-process Kafka, SQLite) and prove every order was charged once", run: runDemo},
		{name: "migrate", args: "--dsn DSN [--print] [--schema S] [--table T] [--outbox]", summary: "apply (or print) the migrations of the processed-messages table", run: runMigrate},
		{name: "inspect", args: "--dsn DSN --scope NAME [--json] KEY", summary: "show the record of a processed message: when, payload hash, expiry", run: runInspect},
		relayCommand,
		{name: "stats", args: "--dsn DSN [--json]", summary: "records per scope, their ages, the expired ones not deleted yet, the table's and indexes' size", run: runStats},
		{name: "purge", args: "--dsn DSN --scope NAME KEY", summary: "delete the record of a key, so that its next delivery runs the handler again", run: runPurge},
		{name: "help", args: "[COMMAND]", summary: "show this help or a command's flags", run: nil},
		{name: "demo-worker", hidden: true, run: runDemoWorker},
	}
}

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	if name == "demo" && len(rest) > 0 && rest[0] == "worker" { // started by the demo's supervisor
		name, rest = "demo-worker", rest[1:]
	}
	if isHelp(name) {
		if len(rest) > 0 && !isHelp(rest[0]) {
			return run([]string{rest[0], "-h"}, stdout, stderr)
		}
		usage(stdout)
		return exitOK
	}
	for _, c := range commands() {
		if c.name != name || c.run == nil {
			continue
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err := c.run(ctx, rest, stdout, stderr)
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "idemq %s: %s\nusage: idemq %s %s\n", name, scrub(err, rest), c.name, c.args)
			return exitUsage
		default:
			fmt.Fprintf(stderr, "idemq %s: %s\n", name, scrub(err, rest))
			return exitFailure
		}
	}
	fmt.Fprintf(stderr, "idemq: unknown command %q\n\n", name)
	usage(stderr)
	return exitUsage
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "help" || arg == "-h" || arg == "--help" || arg == "-help"
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "idemq: exactly-once effects for message-queue workers.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "usage: idemq COMMAND [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		if !c.hidden {
			fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "A DSN is a PostgreSQL URL (postgres://user@host:5432/db) or a SQLite file")
	fmt.Fprintln(w, "(sqlite:path/to/file.db, or a path ending in .db, .sqlite or .sqlite3).")
	fmt.Fprintln(w, "Run 'idemq help COMMAND' for a command's flags.")
}

// newFlags returns a flag set that reports errors instead of exiting.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("idemq "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses args, turning flag errors into usage errors.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

// dialectOf tells the dialect and the driver data source of a DSN.
func dialectOf(dsn string) (sqldedup.Dialect, string, error) {
	switch {
	case dsn == "":
		return "", "", fmt.Errorf("%w: --dsn is required (or set IDEMQ_DSN)", errUsage)
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return sqldedup.Postgres, dsn, nil
	case strings.HasPrefix(dsn, "sqlite://"):
		return sqldedup.SQLite, strings.TrimPrefix(dsn, "sqlite://"), nil
	case strings.HasPrefix(dsn, "sqlite:"):
		return sqldedup.SQLite, strings.TrimPrefix(dsn, "sqlite:"), nil
	case strings.HasSuffix(dsn, ".db"), strings.HasSuffix(dsn, ".sqlite"), strings.HasSuffix(dsn, ".sqlite3"):
		return sqldedup.SQLite, dsn, nil
	}
	return "", "", fmt.Errorf("%w: cannot tell the database of DSN %q: use postgres://... or sqlite:FILE", errUsage, redact.String(dsn))
}

// dsnEnv are the environment variables a DSN flag's default comes from.
var dsnEnv = []string{"IDEMQ_DSN", "DATABASE_URL", "TEST_DATABASE_URL", "IDEMQ_AMQP_URL", "IDEMQ_SQS_ENDPOINT"}

// dsnFlags are the flags that take a DSN or a URL that may carry credentials.
var dsnFlags = []string{"dsn", "db", "amqp-url", "sqs-endpoint"}

// dsnValue is a flag holding a DSN: help text shows its default redacted.
type dsnValue struct{ s *string }

func (v dsnValue) String() string {
	if v.s == nil {
		return ""
	}
	return redact.String(*v.s)
}

func (v dsnValue) Set(s string) error { *v.s = s; return nil }

// dsnVar defines a DSN flag whose default, shown by -h, is redacted.
func dsnVar(fs *flag.FlagSet, p *string, name, def, usage string) {
	*p = def
	fs.Var(dsnValue{p}, name, usage)
}

// scrub returns err's text with the secrets of every DSN the command line
// or the environment gave masked: drivers quote database names and paths in
// their errors, and the demo's workers report theirs.
func scrub(err error, args []string) string {
	var dsns []string
	for _, n := range dsnEnv {
		dsns = append(dsns, os.Getenv(n))
	}
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !slices.Contains(dsnFlags, name) {
			continue
		}
		if !hasValue && i+1 < len(args) {
			value = args[i+1]
		}
		dsns = append(dsns, value)
	}
	return redact.Scrub(err.Error(), dsns...)
}

// storeFlags are the flags every database command takes.
type storeFlags struct {
	dsn, schema, table string
}

func (f *storeFlags) register(fs *flag.FlagSet) {
	dsnVar(fs, &f.dsn, "dsn", os.Getenv("IDEMQ_DSN"), "database `DSN`: postgres://... URL or sqlite:FILE; $IDEMQ_DSN if set (a default is shown redacted)")
	fs.StringVar(&f.schema, "schema", "", `PostgreSQL schema of the table (default "public")`)
	fs.StringVar(&f.table, "table", "", `table name (default "processed_messages")`)
}

// open opens the database and the store. For --print, connect is false and
// no connection is made.
func (f *storeFlags) open(ctx context.Context, connect bool) (*sqldedup.Store, func(), error) {
	dialect, source, err := dialectOf(f.dsn)
	if err != nil {
		return nil, nil, err
	}
	if dialect == sqldedup.SQLite && f.schema != "" {
		return nil, nil, fmt.Errorf("%w: --schema is for PostgreSQL; SQLite has none", errUsage)
	}
	cfg := sqldedup.Config{Dialect: dialect, Schema: f.schema, Table: f.table}
	var db *sql.DB
	switch {
	case !connect:
		db = &sql.DB{} // never used: MigrationSQL does not touch the database
	case dialect == sqldedup.SQLite:
		if db, err = sqldedup.OpenSQLite(ctx, source); err != nil {
			return nil, nil, err
		}
	default:
		if db, err = sql.Open("pgx", source); err != nil {
			return nil, nil, err
		}
		if err := db.PingContext(ctx); err != nil {
			db.Close()
			return nil, nil, fmt.Errorf("connect: %w", err)
		}
	}
	closeDB := func() {
		if connect {
			db.Close()
		}
	}
	store, err := sqldedup.New(db, cfg)
	if err != nil {
		closeDB()
		return nil, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	return store, closeDB, nil
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("migrate", stderr)
	var sf storeFlags
	sf.register(fs)
	print := fs.Bool("print", false, "print the SQL instead of applying it (no connection is made)")
	outboxTable := fs.Bool("outbox", false, "the outbox table's migrations (sinks/outbox) instead of the processed-messages table's")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if *outboxTable {
		return migrateOutbox(ctx, sf.dsn, *print, stdout)
	}
	store, closeDB, err := sf.open(ctx, !*print)
	if err != nil {
		return err
	}
	defer closeDB()
	if *print {
		sql, err := store.MigrationSQL()
		if err != nil {
			return err
		}
		fmt.Fprint(stdout, sql)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	c := store.Config()
	where := c.Table
	if c.Dialect == sqldedup.Postgres {
		where = c.Schema + "." + c.Table
	}
	fmt.Fprintf(stdout, "migrated: %s (%s) is up to date\n", where, c.Dialect)
	return nil
}

// keyCommand parses the flags of inspect and purge: a DSN, a scope, the
// command's own flags (extra, if set) and one key.
func keyCommand(ctx context.Context, name string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (*sqldedup.Store, func(), string, string, error) {
	fs := newFlags(name, stderr)
	var sf storeFlags
	sf.register(fs)
	scope := fs.String("scope", "", "the consumer's name (consumer.Config.Name), the scope of its records; required")
	if extra != nil {
		extra(fs)
	}
	if err := parse(fs, args); err != nil {
		return nil, nil, "", "", err
	}
	if *scope == "" {
		return nil, nil, "", "", fmt.Errorf("%w: --scope is required", errUsage)
	}
	if fs.NArg() != 1 {
		return nil, nil, "", "", fmt.Errorf("%w: want exactly one KEY after the flags, got %d arguments", errUsage, fs.NArg())
	}
	store, closeDB, err := sf.open(ctx, true)
	if err != nil {
		return nil, nil, "", "", err
	}
	return store, closeDB, *scope, fs.Arg(0), nil
}

// inspectOutput is the output of `idemq inspect --json`.
type inspectOutput struct {
	Scope string `json:"scope"`
	Key   string `json:"key"`
	// State is "processed", or "expired": the record no longer
	// deduplicates and the janitor will delete it.
	State       string    `json:"state"`
	ProcessedAt time.Time `json:"processed_at"`
	PayloadHash string    `json:"payload_hash"` // "sha256:<hex>"
	ExpiresAt   time.Time `json:"expires_at"`
	// ExpiresIn is the time left until ExpiresAt, in seconds (negative
	// once expired).
	ExpiresIn float64 `json:"expires_in_seconds"`
}

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	store, closeDB, scope, key, err := keyCommand(ctx, "inspect", args, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON instead of text")
	})
	if err != nil {
		return err
	}
	defer closeDB()
	e, err := store.Inspect(ctx, scope, key)
	if errors.Is(err, dedup.ErrNotFound) {
		return fmt.Errorf("no record of key %q in scope %q: it was never processed, or its record expired and was cleaned up", key, scope)
	}
	if err != nil {
		return err
	}
	now := time.Now()
	if asJSON {
		state := "processed"
		if !e.ExpiresAt.After(now) {
			state = "expired"
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(inspectOutput{
			Scope: e.Scope, Key: e.Key, State: state,
			ProcessedAt: e.ProcessedAt.UTC(), PayloadHash: "sha256:" + e.PayloadHash.String(),
			ExpiresAt: e.ExpiresAt.UTC(), ExpiresIn: e.ExpiresAt.Sub(now).Seconds(),
		})
	}
	state := "processed"
	if !e.ExpiresAt.After(now) {
		state = "expired (no longer deduplicates; the janitor will delete it)"
	}
	fmt.Fprintf(stdout, "scope         %s\n", e.Scope)
	fmt.Fprintf(stdout, "key           %s\n", e.Key)
	fmt.Fprintf(stdout, "state         %s\n", state)
	fmt.Fprintf(stdout, "processed at  %s\n", e.ProcessedAt.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(stdout, "payload hash  sha256:%s\n", e.PayloadHash)
	fmt.Fprintf(stdout, "expires at    %s (in %s)\n", e.ExpiresAt.UTC().Format(time.RFC3339Nano), time.Until(e.ExpiresAt).Round(time.Second))
	return nil
}

func runPurge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	store, closeDB, scope, key, err := keyCommand(ctx, "purge", args, stderr, nil)
	if err != nil {
		return err
	}
	defer closeDB()
	ok, err := store.Purge(ctx, scope, key)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("no record of key %q in scope %q", key, scope)
	}
	fmt.Fprintf(stdout, "purged: the next delivery of %q runs the handler again\n", key)
	return nil
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", stderr)
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
	dsnVar(fs, &cfg.DatabaseURL, "db", env("postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable", "DATABASE_URL", "TEST_DATABASE_URL"), "PostgreSQL `URL` for --store postgres; $DATABASE_URL if set (the default is shown redacted)")
	fs.DurationVar(&cfg.Timeout, "timeout", demo.DefaultTimeout, "give up after this long")
	fs.BoolVar(&cfg.Verbose, "v", false, "show the workers' logs")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	cfg.KafkaBrokers = strings.Split(kafka, ",")
	if cfg.Store != demo.StorePostgres {
		cfg.DatabaseURL = ""
	}
	cfg.Out = stdout
	sum, err := demo.Run(ctx, cfg)
	if errors.Is(err, demo.ErrConfig) {
		return fmt.Errorf("%w: %v", errUsage, err)
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

func runDemoWorker(ctx context.Context, args []string, stdout, _ io.Writer) error {
	o, err := demo.ParseWorkerFlags(args)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return demo.RunWorker(ctx, o, stdout)
}

// env returns the first non-empty environment variable of names, else def.
func env(def string, names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return def
}
