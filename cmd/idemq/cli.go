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
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/sqldedup"
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

// demoMoved answers `idemq demo`: the demo is a program of its own, so that
// the operations command does not link its in-process broker.
const demoMoved = "idemq: the demo is no longer an idemq command: run `make demo`, or `go run ./cmd/idemq-demo [flags]` (-h for its flags)"

// command is an entry of the command table.
type command struct {
	// args are the positional arguments, as the usage line shows them
	// after "[flags]".
	name, args, summary string
	run                 func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	hidden              bool
}

// synopsis is the command's usage line, without "usage: ".
func (c command) synopsis() string {
	s := "idemq " + c.name + " [flags]"
	if c.args != "" {
		s += " " + c.args
	}
	return s
}

func commands() []command {
	return []command{
		{name: "migrate", summary: "apply (or print) the migrations of the processed-messages table (--outbox: of the outbox table)", run: runMigrate},
		{name: "inspect", args: "SCOPE KEY", summary: "show the record of a processed message: when, payload hash, expiry", run: runInspect},
		relayCommand(),
		dlqCommand(),
		consoleCommand(),
		{name: "stats", summary: "records per scope, their ages, the expired ones not deleted yet, the table's and indexes' size", run: runStats},
		{name: "purge", args: "SCOPE KEY", summary: "delete the record of a key, so that its next delivery runs the handler again", run: runPurge},
		{name: "version", summary: "print idemq's version and the Go version it was built with", run: runVersion},
		{name: "help", args: "[COMMAND]", summary: "show this help or a command's arguments and flags", run: nil},
	}
}

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	if name == "demo" {
		fmt.Fprintln(stderr, demoMoved)
		return exitUsage
	}
	if name == "-version" || name == "--version" {
		name = "version"
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
		var help *helpError
		switch {
		case err == nil:
			return exitOK
		case errors.As(err, &help):
			// Asked for, the help is the command's output.
			fmt.Fprint(stdout, help.text)
			return exitOK
		case errors.Is(err, errUsage):
			msg := strings.TrimPrefix(scrub(err, rest), errUsage.Error()+": ")
			fmt.Fprintf(stderr, "idemq %s: %s\nusage: %s\nRun 'idemq help %s' for the flags.\n", name, msg, c.synopsis(), c.name)
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
	fmt.Fprintln(w, "Run 'idemq help COMMAND' for a command's arguments and flags.")
}

// newFlags returns a flag set that reports errors instead of exiting, and
// whose help shows the command's usage line (with its positional
// arguments), its summary and its flags. Parsed with parse, it prints
// nothing itself: parse returns its errors, and its help as a *helpError.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("idemq "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := command{name: name}
	for _, cmd := range commands() {
		if cmd.name == name {
			c = cmd
		}
	}
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s\n", c.synopsis())
		if c.summary != "" {
			fmt.Fprintf(w, "\n%s.\n", strings.ToUpper(c.summary[:1])+c.summary[1:])
		}
		if c.args != "" {
			fmt.Fprintf(w, "\nFlags may come before or after the arguments; -- ends the flags.\n")
		}
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintf(w, "\nflags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// helpError is the error of a command line that asks for the command's
// help (-h, --help): run prints text, the help, on stdout and exits with
// status 0. It matches flag.ErrHelp.
type helpError struct {
	text string
}

func (e *helpError) Error() string { return "help requested" }

func (e *helpError) Unwrap() error { return flag.ErrHelp }

// parse parses args, flags and positional arguments in any order, and
// returns the positional arguments. Go's flag package stops at the first
// argument that is not a flag; parse takes that argument and goes on with
// the rest. After "--", every argument is positional. Flag errors become
// usage errors, which run prints once; a request for help is a *helpError.
// The flag package's own printing of the error and the help is silenced.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	defer fs.SetOutput(out)
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				var help strings.Builder
				fs.SetOutput(&help)
				fs.Usage()
				return nil, &helpError{text: help.String()}
			}
			return nil, fmt.Errorf("%w: %w", errUsage, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if endedByTerminator(fs, args[:len(args)-len(rest)]) {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// endedByTerminator reports whether fs stopped parsing parsed (the
// arguments it consumed) at a "--" that ends the flags, rather than one
// that is a flag's value.
func endedByTerminator(fs *flag.FlagSet, parsed []string) bool {
	for i := 0; i < len(parsed); i++ {
		a := parsed[i]
		if a == "--" {
			return true
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if hasValue {
			continue
		}
		if f := fs.Lookup(name); f != nil {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				continue
			}
		}
		i++ // the flag's value
	}
	return false
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
	return "", "", fmt.Errorf("%w: cannot tell the database of DSN %q: use postgres://... or sqlite:FILE", errUsage, redact.DSN(dsn))
}

// dsnEnv are the environment variables a DSN flag's default comes from.
var dsnEnv = []string{"IDEMQ_DSN", "DATABASE_URL", "TEST_DATABASE_URL", "IDEMQ_AMQP_URL", "IDEMQ_SQS_ENDPOINT"}

// dsnFlags are the flags that take a DSN or a URL that may carry credentials.
var dsnFlags = []string{"dsn", "amqp-url", "sqs-endpoint"}

// dsnValue is a flag holding a DSN: help text shows its default redacted.
type dsnValue struct{ s *string }

func (v dsnValue) String() string {
	if v.s == nil {
		return ""
	}
	return redact.DSN(*v.s)
}

func (v dsnValue) Set(s string) error { *v.s = s; return nil }

// dsnVar defines a DSN flag whose default, shown by -h, is redacted.
func dsnVar(fs *flag.FlagSet, p *string, name, def, usage string) {
	*p = def
	fs.Var(dsnValue{p}, name, usage)
}

// scrub returns err's text with the secrets of every DSN the command line
// or the environment gave masked: drivers quote database names and paths in
// their errors.
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
	return redact.ScrubDSN(err.Error(), dsns...)
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

// openMode tells storeFlags.open whether to connect, and whether a SQLite
// file may be created.
type openMode int

const (
	// noConnect makes no connection (migrate --print).
	noConnect openMode = iota
	// createDB creates a missing SQLite file (migrate).
	createDB
	// existingDB refuses a missing SQLite file (inspect, purge, stats, relay): a
	// command that reads the table never creates an empty database.
	existingDB
)

// noTableError is the error of a command that reads a table that does not
// exist, or a SQLite file that does not exist.
type noTableError struct {
	// Table is the table's name, schema-qualified on PostgreSQL.
	Table string
	// MissingFile is the SQLite file that does not exist, if that is why.
	MissingFile string
}

func (e *noTableError) Error() string {
	create := "idemq migrate"
	if e.Table == outboxTable {
		create = "idemq migrate --outbox"
	}
	if e.MissingFile != "" {
		return fmt.Sprintf("the database file %s does not exist, so there is no table %s: check --dsn, or create both with %s", e.MissingFile, e.Table, create)
	}
	return fmt.Sprintf("there is no table %s in this database: check --dsn, --schema and --table, or create it with %s", e.Table, create)
}

// outboxTable is the outbox's table (sinks/outbox's migrations).
const outboxTable = "idemq_outbox"

// isNoTable reports whether err is the database's "no such table" error.
func isNoTable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "42P01" || pgErr.Code == "3F000" // undefined_table, invalid_schema_name
	}
	return err != nil && strings.Contains(err.Error(), "no such table")
}

// noTable returns a *noTableError for table if err is a "no such table"
// error, else err.
func noTable(err error, table string) error {
	if isNoTable(err) {
		return &noTableError{Table: table}
	}
	return err
}

// openSQLite opens the SQLite file at path; with existingDB, a missing file
// is a *noTableError naming table, and is not created.
func openSQLite(ctx context.Context, path string, mode openMode, table string) (*sql.DB, error) {
	if mode == existingDB {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil, &noTableError{Table: table, MissingFile: path}
		}
	}
	return sqldedup.OpenSQLite(ctx, path)
}

// tableName is the processed-messages table of c as messages name it:
// schema-qualified on PostgreSQL.
func tableName(c sqldedup.Config) string {
	if c.Dialect == sqldedup.Postgres {
		return c.Schema + "." + c.Table
	}
	return c.Table
}

// openSQL opens the database of dialect at source through database/sql
// (PostgreSQL through pgx's stdlib driver) and checks that it answers; see
// openMode (not noConnect) for a SQLite file. table names the table the
// command reads, for the error about a missing file.
func openSQL(ctx context.Context, dialect sqldedup.Dialect, source string, mode openMode, table string) (*sql.DB, error) {
	if dialect == sqldedup.SQLite {
		return openSQLite(ctx, source, mode, table)
	}
	db, err := sql.Open("pgx", source)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("connect: %w", err), db.Close())
	}
	return db, nil
}

// open opens the database and the store; see openMode.
func (f *storeFlags) open(ctx context.Context, mode openMode) (*sqldedup.Store, func(), error) {
	dialect, source, err := dialectOf(f.dsn)
	if err != nil {
		return nil, nil, err
	}
	if dialect == sqldedup.SQLite && f.schema != "" {
		return nil, nil, fmt.Errorf("%w: --schema is for PostgreSQL; SQLite has none", errUsage)
	}
	cfg := sqldedup.Config{Dialect: dialect, Schema: f.schema, Table: f.table}
	// Validate the names before any connection or file is made.
	store, err := sqldedup.New(&sql.DB{}, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	if mode == noConnect {
		return store, func() {}, nil
	}
	db, err := openSQL(ctx, dialect, source, mode, tableName(store.Config()))
	if err != nil {
		return nil, nil, err
	}
	closeDB := func() { db.Close() }
	store, err = sqldedup.New(db, cfg)
	if err != nil {
		closeDB()
		return nil, nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	return store, closeDB, nil
}

// keyCommand parses the command line of inspect and purge: a DSN, the
// command's own flags (extra, if set), and a scope and a key (or --scope
// and a key).
func keyCommand(ctx context.Context, name string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (*sqldedup.Store, func(), string, string, error) {
	fs := newFlags(name, stderr)
	var sf storeFlags
	sf.register(fs)
	scope := fs.String("scope", "", "the scope (the consumer's name, consumer.Config.Name), instead of the SCOPE argument: then KEY is the only argument")
	if extra != nil {
		extra(fs)
	}
	pos, err := parse(fs, args)
	if err != nil {
		return nil, nil, "", "", err
	}
	switch {
	case *scope != "" && len(pos) != 1:
		return nil, nil, "", "", fmt.Errorf("%w: with --scope, want one argument, KEY; got %d", errUsage, len(pos))
	case *scope == "" && len(pos) != 2:
		return nil, nil, "", "", fmt.Errorf("%w: want two arguments, SCOPE and KEY (the scope is the consumer's name); got %d", errUsage, len(pos))
	case *scope == "":
		*scope, pos = pos[0], pos[1:]
	}
	store, closeDB, err := sf.open(ctx, existingDB)
	if err != nil {
		return nil, nil, "", "", err
	}
	return store, closeDB, *scope, pos[0], nil
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
	// Result is the result stored with the record (base64 in JSON), absent
	// when there is none; ResultText is the same when it is valid UTF-8.
	Result     []byte `json:"result,omitempty"`
	ResultText string `json:"result_text,omitempty"`
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
	err = noTable(err, tableName(store.Config()))
	if errors.Is(err, dedup.ErrNotFound) {
		return fmt.Errorf("no record of key %q in scope %q: it was not processed, or its record expired and was cleaned up; "+
			"if it failed, look in the dead-letter queue: idemq dlq list --broker kafka|sqs|rabbitmq --dlq TOPIC|QUEUE --key %s", key, scope, shellQuote(key))
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
		return writeJSON(stdout, inspectOutput{
			Scope: e.Scope, Key: e.Key, State: state,
			ProcessedAt: e.ProcessedAt.UTC(), PayloadHash: "sha256:" + e.PayloadHash.String(),
			ExpiresAt: e.ExpiresAt.UTC(), ExpiresIn: e.ExpiresAt.Sub(now).Seconds(),
			Result: e.Result, ResultText: resultText(e.Result),
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
	if e.Result != nil {
		fmt.Fprintf(stdout, "result        %s\n", showResult(e.Result))
	}
	return nil
}

// shellQuote returns s as one word of a POSIX shell command line: as it is
// when it holds only characters no shell treats specially, else in single
// quotes.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,:/@%+=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// maxShownResult bounds the bytes of a stored result that inspect prints as
// text; --json prints all of it.
const maxShownResult = 1024

// showResult renders a stored result for the text output of inspect: its
// size and its bytes quoted as a Go string (so control characters and
// invalid UTF-8 cannot reach the terminal), cut at maxShownResult bytes.
func showResult(b []byte) string {
	shown, more := b, ""
	if len(shown) > maxShownResult {
		shown, more = shown[:maxShownResult], " ..."
	}
	return fmt.Sprintf("%d bytes %s%s", len(b), strconv.Quote(string(shown)), more)
}

// resultText returns b as a string when it is valid UTF-8, else "".
func resultText(b []byte) string {
	if !utf8.Valid(b) {
		return ""
	}
	return string(b)
}

// purgeOutput is the output of `idemq purge --json`.
type purgeOutput struct {
	Scope string `json:"scope"`
	Key   string `json:"key"`
	// Purged says the record was deleted; false in a dry run.
	Purged bool `json:"purged"`
	// DryRun says nothing was changed: the record exists and would be
	// deleted.
	DryRun bool `json:"dry_run"`
}

func runPurge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON, dryRun bool
	store, closeDB, scope, key, err := keyCommand(ctx, "purge", args, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON instead of text")
		fs.BoolVar(&dryRun, "dry-run", false, "say whether there is a record to delete, and delete nothing")
	})
	if err != nil {
		return err
	}
	defer closeDB()
	var ok bool
	if dryRun {
		_, err = store.Inspect(ctx, scope, key)
		ok = err == nil
		if errors.Is(err, dedup.ErrNotFound) {
			err = nil
		}
	} else {
		ok, err = store.Purge(ctx, scope, key)
	}
	if err != nil {
		return noTable(err, tableName(store.Config()))
	}
	if !ok {
		return fmt.Errorf("no record of key %q in scope %q", key, scope)
	}
	if asJSON {
		return writeJSON(stdout, purgeOutput{Scope: scope, Key: key, Purged: !dryRun, DryRun: dryRun})
	}
	if dryRun {
		fmt.Fprintf(stdout, "dry run, nothing changed: purge would delete the record of %q in scope %q\n", key, scope)
		return nil
	}
	fmt.Fprintf(stdout, "purged: the next delivery of %q runs the handler again\n", key)
	return nil
}

// writeJSON writes v to w as indented JSON, the output of every --json
// flag. It keeps <, > and & as they are ("<1h", not "\u003c1h"): the
// output is for terminals and scripts, not for an HTML page.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
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

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", stderr)
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, pos)
	}
	bi, ok := debug.ReadBuildInfo()
	fmt.Fprintln(stdout, versionString(bi, ok))
	return nil
}

// versionString describes the build: the main module's version (a release
// such as v1.2.0 when installed with go install ...@version; "(devel)" or
// a pseudo-version when built from a checkout), the VCS revision and
// whether the checkout was modified when known, and the Go version, OS and
// architecture.
func versionString(bi *debug.BuildInfo, ok bool) string {
	goVersion := runtime.Version()
	if !ok || bi == nil {
		return fmt.Sprintf("idemq (unknown version: no build information) %s %s/%s", goVersion, runtime.GOOS, runtime.GOARCH)
	}
	if bi.GoVersion != "" {
		goVersion = bi.GoVersion
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	parts := []string{"idemq", v}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" {
		r := "revision " + rev
		if modified == "true" {
			r += " (modified)"
		}
		parts = append(parts, r)
	}
	parts = append(parts, goVersion, runtime.GOOS+"/"+runtime.GOARCH)
	return strings.Join(parts, " ")
}
