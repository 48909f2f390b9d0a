package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/sources/amqpsource/amqpdlq"
	"github.com/idemq/idemq/sources/kafkasource/kafkadlq"
	"github.com/idemq/idemq/sources/sqssource"
	"github.com/idemq/idemq/sources/sqssource/sqsdlq"
)

// dlqCommand is the dead-letter command's entry in the command table.
func dlqCommand() command {
	return command{
		name:    "dlq",
		args:    "list|show|replay|purge [ID|KEY...]",
		summary: "list, show, replay or purge the dead letters of a topic or queue (--broker, --dlq), all or by ID, key or filter",
		run:     runDLQ,
	}
}

// dlqFlags are the flags of idemq dlq.
type dlqFlags struct {
	broker, dlqName, brokers, group, sqsEndpoint, amqpURL, origin, keyAttr, keyHeader string
	reason, key, since, until                                                         string
	limit                                                                             int
	dryRun, asJSON, all, native                                                       bool
	store                                                                             storeFlags
	scope                                                                             string
}

func (f *dlqFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.broker, "broker", "", "kafka, sqs or rabbitmq (required)")
	fs.StringVar(&f.dlqName, "dlq", "", "the dead letters: Kafka topic (<topic>.dlq), SQS queue URL or RabbitMQ queue (<queue>.dlq) (required)")
	fs.StringVar(&f.brokers, "brokers", env("127.0.0.1:9092", "IDEMQ_KAFKA_BROKERS"), "Kafka bootstrap addresses, comma-separated; env IDEMQ_KAFKA_BROKERS")
	fs.StringVar(&f.group, "group", kafkadlq.DefaultGroup, "Kafka: the name under which what was replayed or purged is recorded (in <topic>.progress, mirrored as this consumer group's offsets)")
	dsnVar(fs, &f.sqsEndpoint, "sqs-endpoint", os.Getenv("IDEMQ_SQS_ENDPOINT"), "SQS endpoint `URL`, for ElasticMQ or LocalStack (env IDEMQ_SQS_ENDPOINT; empty: the AWS configuration)")
	dsnVar(fs, &f.amqpURL, "amqp-url", env("amqp://guest:guest@127.0.0.1:5672/", "IDEMQ_AMQP_URL"), "RabbitMQ `URL`; env IDEMQ_AMQP_URL (the default is shown redacted)")
	fs.StringVar(&f.origin, "origin", "", "SQS: the queue URL to replay dead letters to that name no origin (moved by a redrive policy)")
	fs.StringVar(&f.keyAttr, "key-attribute", "", "SQS: the message attribute holding the key (sqssource.Config.KeyAttribute)")
	fs.StringVar(&f.keyHeader, "key-header", "", `Kafka, RabbitMQ: the header holding the key, for dead letters without idemq-key (default "idempotency-key")`)
	fs.StringVar(&f.reason, "reason", "", "select the dead letters whose reason contains this text (case-insensitive)")
	fs.StringVar(&f.key, "key", "", "select the dead letters whose key matches this glob (*, ?, [a-z])")
	fs.StringVar(&f.since, "since", "", "select the dead letters dead-lettered at or after this time (RFC 3339, or a duration ago: 2h)")
	fs.StringVar(&f.until, "until", "", "select the dead letters dead-lettered before this time (RFC 3339, or a duration ago: 30m)")
	fs.IntVar(&f.limit, "limit", 0, "select at most this many dead letters (0: all; without --limit, list's table shows the first 100 and says if more are left)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "replay, purge: show what would be replayed or purged, and change nothing")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON (one object per dead letter, or the result) for scripts")
	fs.BoolVar(&f.all, "all", false, "purge: allow a purge without a filter (every dead letter)")
	fs.BoolVar(&f.native, "native", true, "sqs replay without a filter: use SQS's message-move task where the dead-letter queue's RedriveAllowPolicy allows one source queue (else receive, send, delete)")
	dsnVar(fs, &f.store.dsn, "dsn", os.Getenv("IDEMQ_DSN"), "replay: the dedup store's database `DSN`, to forget each replayed key's failure count (with --scope); optional")
	fs.StringVar(&f.store.schema, "schema", "", `PostgreSQL schema of the processed-messages table (default "public")`)
	fs.StringVar(&f.store.table, "table", "", `processed-messages table name (default "processed_messages")`)
	fs.StringVar(&f.scope, "scope", "", "replay: the runner's Config.Name, whose failure counts --dsn forgets")
}

// filter builds the selection of the flags and the IDs or keys given.
func (f *dlqFlags) filter(now time.Time, ids []string) (dlq.Filter, error) {
	flt := dlq.Filter{Reason: f.reason, Key: f.key, Limit: f.limit, IDs: ids}
	var err error
	if flt.Since, err = parseWhen(f.since, now); err != nil {
		return flt, fmt.Errorf("%w: --since: %w", errUsage, err)
	}
	if flt.Until, err = parseWhen(f.until, now); err != nil {
		return flt, fmt.Errorf("%w: --until: %w", errUsage, err)
	}
	if err := flt.Validate(); err != nil {
		return flt, fmt.Errorf("%w: %w", errUsage, err)
	}
	return flt, nil
}

// parseWhen reads an RFC 3339 time, or a duration before now.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a duration (90m)", s)
	}
	return t, nil
}

func (f *dlqFlags) open(ctx context.Context) (dlq.Broker, error) {
	if f.dlqName == "" {
		return nil, fmt.Errorf("%w: --dlq is required: the dead-letter topic or queue", errUsage)
	}
	switch f.broker {
	case "kafka":
		b, err := kafkadlq.New(kafkadlq.Config{Brokers: strings.Split(f.brokers, ","), Topic: f.dlqName, Group: f.group, KeyHeader: f.keyHeader})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errUsage, err)
		}
		return b, nil
	case "sqs":
		c, err := sqssource.NewClient(ctx, f.sqsEndpoint)
		if err != nil {
			return nil, err
		}
		b, err := sqsdlq.New(sqsdlq.Config{Client: c, QueueURL: f.dlqName, OriginQueueURL: f.origin, KeyAttribute: f.keyAttr})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errUsage, err)
		}
		return b, nil
	case "rabbitmq":
		b, err := amqpdlq.New(amqpdlq.Config{URL: f.amqpURL, Queue: f.dlqName, KeyHeader: f.keyHeader})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errUsage, err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("%w: --broker must be kafka, sqs or rabbitmq, not %q", errUsage, f.broker)
}

func runDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dlq", stderr)
	var f dlqFlags
	f.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return fmt.Errorf("%w: which subcommand: list, show, replay or purge?", errUsage)
	}
	sub, ids := pos[0], pos[1:]
	limitSet := false
	fs.Visit(func(fl *flag.Flag) { limitSet = limitSet || fl.Name == "limit" })
	switch {
	case !slices.Contains([]string{"list", "show", "replay", "purge"}, sub):
		return fmt.Errorf("%w: unknown subcommand %q: list, show, replay or purge", errUsage, sub)
	case sub == "show" && len(ids) == 0:
		return fmt.Errorf("%w: show needs the IDs or keys of the dead letters to show", errUsage)
	case f.dryRun && (sub == "list" || sub == "show"):
		return fmt.Errorf("%w: --dry-run is for replay and purge; %s changes nothing", errUsage, sub)
	}
	flt, err := f.filter(time.Now(), ids)
	if err != nil {
		return err
	}
	selective := flt.Selective()
	if sub == "purge" && !selective && !f.all && !f.dryRun {
		return fmt.Errorf("%w: purge without IDs, keys, --reason, --key, --since, --until or --limit removes every dead letter: add --all if that is what you want", errUsage)
	}
	b, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer b.Close()

	switch sub {
	case "list":
		if !limitSet && !f.asJSON {
			flt.Limit = listLimit
		}
		ls, more, err := dlq.ListMore(ctx, b, flt)
		if err != nil {
			return err
		}
		cut := ""
		if more {
			cut = fmt.Sprintf("the first %s shown; more are left (--limit 0 shows all)", deadLetters(len(ls)))
		}
		if f.asJSON {
			if cut != "" {
				fmt.Fprintf(stderr, "idemq dlq list: %s\n", cut)
			}
			return writeJSON(stdout, lettersJSON(ls))
		}
		writeRows(stdout, ls)
		if cut != "" {
			fmt.Fprintln(stdout, cut)
		} else {
			fmt.Fprintln(stdout, deadLetters(len(ls)))
		}
		return nil
	case "show":
		ls, err := dlq.List(ctx, b, flt)
		if err != nil {
			return err
		}
		if len(ls) == 0 {
			return fmt.Errorf("no dead letter has the ID or key %s", strings.Join(ids, ", "))
		}
		if f.asJSON {
			return writeJSON(stdout, lettersJSON(ls))
		}
		for i, l := range ls {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			writeLetter(stdout, l)
		}
		return nil
	}

	opts := dlq.Options{DryRun: f.dryRun}
	verb := map[string]string{"replay": "replayed", "purge": "purged"}[sub]
	if !f.asJSON {
		last := time.Now()
		opts.Progress = func(done int) {
			if time.Since(last) >= time.Second {
				last = time.Now()
				fmt.Fprintf(stderr, "idemq dlq %s: %s %d so far\n", sub, verb, done)
			}
		}
	}
	if sub == "replay" && f.store.dsn != "" {
		if f.scope == "" {
			return fmt.Errorf("%w: --dsn needs --scope, the runner's Config.Name", errUsage)
		}
		store, closeDB, err := f.store.open(ctx, existingDB)
		if err != nil {
			return err
		}
		defer closeDB()
		opts.Failures, opts.Scope = store.Driver(), f.scope
	}
	if sq, ok := b.(*sqsdlq.Broker); ok && sub == "replay" && !selective && !f.dryRun && f.native && opts.Failures == nil {
		moved, done, err := nativeMove(ctx, sq, f.origin, opts.Progress)
		if done {
			if err != nil {
				return err
			}
			return report(stdout, f.asJSON, f.dryRun, sub, verb, dlq.Result{Done: moved}, "through SQS's message-move task")
		}
		if err != nil {
			fmt.Fprintf(stderr, "idemq dlq replay: %v; replaying by receive, send and delete instead\n", err)
		}
	}
	var res dlq.Result
	if sub == "replay" {
		res, err = dlq.Replay(ctx, b, flt, opts)
	} else {
		res, err = dlq.Purge(ctx, b, flt, opts)
	}
	if err != nil {
		_ = report(stdout, f.asJSON, f.dryRun, sub, verb, res, "")
		if f.dryRun {
			return fmt.Errorf("dry run: %w", err)
		}
		if res.Done > 0 || sub == "replay" {
			return fmt.Errorf("%s %s, then: %w (nothing is lost: run the same command again to go on)", verb, deadLetters(res.Done), err)
		}
		return err
	}
	if missing := unmatched(ids, res.Letters); len(missing) > 0 {
		fmt.Fprintf(stderr, "idemq dlq %s: no dead letter selected has the ID or key %s (replayed or purged already?)\n", sub, strings.Join(missing, ", "))
	}
	return report(stdout, f.asJSON, f.dryRun, sub, verb, res, "")
}

// listLimit is how many dead letters list's table shows without --limit.
const listLimit = 100

// unmatched returns the ids that name none of ls, by ID or key.
func unmatched(ids []string, ls []*dlq.Letter) []string {
	var out []string
	for _, id := range ids {
		if !slices.ContainsFunc(ls, func(l *dlq.Letter) bool { return l.ID == id || (l.Key != "" && l.Key == id) }) {
			out = append(out, id)
		}
	}
	return out
}

// deadLetters is "1 dead letter" or "n dead letters".
func deadLetters(n int) string {
	if n == 1 {
		return "1 dead letter"
	}
	return strconv.Itoa(n) + " dead letters"
}

// nativeMove replays a whole SQS dead-letter queue with a message-move
// task: to --origin, else to the one origin its dead letters name, else
// (none names one: a redrive policy moved them) to the one source queue
// of its RedriveAllowPolicy; sqsdlq.Broker.MoveAll refuses any other case.
// done reports whether the move was made (or failed after it started);
// when it is false, the caller replays by receive, send and delete.
func nativeMove(ctx context.Context, b *sqsdlq.Broker, origin string, progress func(int)) (moved int, done bool, err error) {
	if origin == "" {
		ls, err := dlq.List(ctx, b, dlq.Filter{})
		if err != nil {
			return 0, false, err
		}
		if len(ls) == 0 {
			return 0, false, nil
		}
		origins := map[string]bool{}
		for _, l := range ls {
			origins[l.Origin] = true
		}
		if len(origins) > 1 {
			return 0, false, errors.New("the dead letters come from several queues, or some name none: a message-move task has one destination")
		}
		origin = ls[0].Origin // "" when a redrive policy moved them all
	}
	moved, err = b.MoveAll(ctx, origin, progress)
	if errors.Is(err, sqsdlq.ErrNativeUnsupported) {
		return 0, false, err
	}
	return moved, true, err
}

// report prints what replay or purge did.
func report(w io.Writer, asJSON, dryRun bool, sub, verb string, res dlq.Result, how string) error {
	if asJSON {
		return writeJSON(w, struct {
			Command string       `json:"command"`
			DryRun  bool         `json:"dry_run"`
			Done    int          `json:"done"`
			Letters []letterJSON `json:"letters"`
		}{sub, dryRun, res.Done, lettersJSON(res.Letters)})
	}
	switch {
	case how != "":
		fmt.Fprintf(w, "%s %s %s\n", verb, deadLetters(res.Done), how)
	case dryRun:
		fmt.Fprintf(w, "dry run, nothing changed: %s would be %s\n", deadLetters(len(res.Letters)), verb)
		if len(res.Letters) > 0 {
			writeRows(w, res.Letters)
		}
	default:
		fmt.Fprintf(w, "%s %s\n", verb, deadLetters(res.Done))
	}
	return nil
}

// letterJSON is a dead letter in --json output.
type letterJSON struct {
	ID             string            `json:"id"`
	Key            string            `json:"key"`
	Reason         string            `json:"reason"`
	Attempts       int               `json:"attempts"`
	Origin         string            `json:"origin"`
	DeadLetteredAt *time.Time        `json:"dead_lettered_at,omitempty"`
	Size           int               `json:"size"`
	Body           string            `json:"body,omitempty"`
	BodyBase64     []byte            `json:"body_base64,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
}

func lettersJSON(ls []*dlq.Letter) []letterJSON {
	out := make([]letterJSON, 0, len(ls))
	for _, l := range ls {
		j := letterJSON{ID: l.ID, Key: l.Key, Reason: l.Reason, Attempts: l.Attempts, Origin: l.Origin, Size: l.Size, Headers: l.Headers}
		if !l.DeadLetteredAt.IsZero() {
			t := l.DeadLetteredAt
			j.DeadLetteredAt = &t
		}
		if utf8.Valid(l.Body) {
			j.Body = string(l.Body)
		} else {
			j.BodyBase64 = l.Body
		}
		out = append(out, j)
	}
	return out
}

// writeRows prints a heading and one line per dead letter.
func writeRows(w io.Writer, ls []*dlq.Letter) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDEAD-LETTERED AT\tATTEMPTS\tKEY\tORIGIN\tREASON")
	for _, l := range ls {
		at := "-"
		if !l.DeadLetteredAt.IsZero() {
			at = l.DeadLetteredAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", l.ID, at, l.Attempts, orDash(l.Key), orDash(l.Origin), oneLine(l.Reason, 80))
	}
	_ = tw.Flush()
}

// writeLetter prints one dead letter in full.
func writeLetter(w io.Writer, l *dlq.Letter) {
	fmt.Fprintf(w, "id:               %s\n", l.ID)
	fmt.Fprintf(w, "key:              %s\n", orDash(l.Key))
	fmt.Fprintf(w, "origin:           %s\n", orDash(l.Origin))
	if !l.DeadLetteredAt.IsZero() {
		fmt.Fprintf(w, "dead-lettered at: %s (%s ago)\n", l.DeadLetteredAt.UTC().Format(time.RFC3339Nano), time.Since(l.DeadLetteredAt).Round(time.Second))
	}
	fmt.Fprintf(w, "attempts:         %d\n", l.Attempts)
	fmt.Fprintf(w, "reason:           %s\n", l.Reason)
	keys := make([]string, 0, len(l.Headers))
	for k := range l.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "header:           %s=%s\n", k, l.Headers[k])
	}
	shown := ""
	if l.Size > len(l.Body) {
		shown = fmt.Sprintf(", first %d shown", len(l.Body))
	}
	fmt.Fprintf(w, "body (%d bytes%s):\n", l.Size, shown)
	if utf8.Valid(l.Body) {
		fmt.Fprintf(w, "  %s\n", l.Body)
	} else {
		fmt.Fprintf(w, "  %q\n", l.Body)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine cuts s to n runes on one line.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
