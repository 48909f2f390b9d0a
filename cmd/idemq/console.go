package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"strings"
	"time"

	"github.com/idemq/idemq/consumer/console"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sources/kafkasource/kafkadlq"
)

// consoleCommand is the console's entry in the command table.
func consoleCommand() command {
	return command{
		name:    "console",
		summary: "serve the operator's web console: dead letters (replay, purge), outbox, dedup table, workers",
		run:     runConsole,
	}
}

// consoleTokenEnv is the environment variable of the console's token.
const consoleTokenEnv = "IDEMQ_CONSOLE_TOKEN"

// minTokenLen is the shortest token idemq console accepts.
const minTokenLen = 16

// listFlag is a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// consoleFlags are the flags of idemq console.
type consoleFlags struct {
	addr, token, prefix, retention string
	readOnly                       bool
	dlqs, workers                  listFlag
	// brokers holds the connection flags of idemq dlq (--brokers,
	// --amqp-url, --sqs-endpoint, --group, --key-header, --key-attribute,
	// --origin) and the dedup store's (--dsn, --schema, --table, --scope).
	brokers dlqFlags
}

func (f *consoleFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "addr", env("127.0.0.1:8089", "IDEMQ_CONSOLE_ADDR"), "listen on this `address`; env IDEMQ_CONSOLE_ADDR (default loopback only: put an authenticating proxy in front before you widen it)")
	fs.StringVar(&f.token, "token", "", "the token that authorises replay and purge (prefer env "+consoleTokenEnv+": a flag shows in the process list); required unless --read-only")
	fs.BoolVar(&f.readOnly, "read-only", false, "refuse every replay and purge: a console for reading only")
	fs.StringVar(&f.prefix, "prefix", "", "the path the console is served under behind a reverse proxy, such as /idemq")
	fs.Var(&f.dlqs, "dlq", "a dead-letter store to show, `BROKER:NAME`: kafka:orders.dlq, rabbitmq:orders.dlq, sqs:QUEUE_URL (repeatable; env IDEMQ_CONSOLE_DLQS, comma-separated)")
	fs.Var(&f.workers, "worker", "a runner to watch, `NAME=URL` of its readiness endpoint (consumer.HealthHandler's readyz, or a console.WorkerReporter's handler) (repeatable; env IDEMQ_CONSOLE_WORKERS, comma-separated)")
	fs.StringVar(&f.retention, "retention", "", `the dedup store's Retention, shown on the dedup page (default "192h", dedup.DefaultRetention)`)
	b := &f.brokers
	fs.StringVar(&b.brokers, "brokers", env("127.0.0.1:9092", "IDEMQ_KAFKA_BROKERS"), "Kafka bootstrap addresses, comma-separated; env IDEMQ_KAFKA_BROKERS")
	fs.StringVar(&b.group, "group", kafkadlq.DefaultGroup, "Kafka: the name under which what was replayed or purged is recorded (in <topic>.progress), as for idemq dlq")
	dsnVar(fs, &b.sqsEndpoint, "sqs-endpoint", os.Getenv("IDEMQ_SQS_ENDPOINT"), "SQS endpoint `URL`, for ElasticMQ or LocalStack (env IDEMQ_SQS_ENDPOINT; empty: the AWS configuration)")
	dsnVar(fs, &b.amqpURL, "amqp-url", env("amqp://guest:guest@127.0.0.1:5672/", "IDEMQ_AMQP_URL"), "RabbitMQ `URL`; env IDEMQ_AMQP_URL (the default is shown redacted)")
	fs.StringVar(&b.origin, "origin", "", "SQS: the queue URL to replay dead letters to that name no origin (moved by a redrive policy)")
	fs.StringVar(&b.keyAttr, "key-attribute", "", "SQS: the message attribute holding the key (sqssource.Config.KeyAttribute)")
	fs.StringVar(&b.keyHeader, "key-header", "", `Kafka, RabbitMQ: the header holding the key, for dead letters without idemq-key (default "idempotency-key")`)
	b.store.register(fs)
	fs.StringVar(&b.scope, "scope", "", "replay: the runner's Config.Name, whose failure counts --dsn's store forgets before each copy is sent")
}

// queues opens nothing: each returned Queue opens its store when the
// console reads or replays it.
func (f *consoleFlags) queues(failures interface {
	ForgetFailures(ctx context.Context, scope, key string) error
}) ([]console.Queue, error) {
	var out []console.Queue
	for _, d := range f.dlqs {
		kind, name, ok := strings.Cut(d, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("%w: --dlq %q: want BROKER:NAME, such as kafka:orders.dlq", errUsage, d)
		}
		b := f.brokers
		b.broker, b.dlqName = kind, name
		switch kind {
		case "kafka", "rabbitmq", "sqs":
		default:
			return nil, fmt.Errorf("%w: --dlq %q: the broker must be kafka, sqs or rabbitmq", errUsage, d)
		}
		label := name
		if kind == "sqs" {
			label = path.Base(name)
		}
		q := console.Queue{Name: label, Broker: kind, Open: func(ctx context.Context) (dlq.Broker, error) { return b.open(ctx) }}
		if failures != nil {
			q.Failures, q.Scope = failures, b.scope
		}
		out = append(out, q)
	}
	return out, nil
}

func (f *consoleFlags) workerList() ([]console.Worker, error) {
	var out []console.Worker
	for _, w := range f.workers {
		name, url, ok := strings.Cut(w, "=")
		if !ok || name == "" || url == "" {
			return nil, fmt.Errorf("%w: --worker %q: want NAME=URL", errUsage, w)
		}
		out = append(out, console.Worker{Name: name, URL: url})
	}
	return out, nil
}

// splitEnv appends the comma-separated values of the environment variable
// name to l when l is empty.
func splitEnv(l *listFlag, name string) {
	if len(*l) > 0 || os.Getenv(name) == "" {
		return
	}
	for _, v := range strings.Split(os.Getenv(name), ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
}

func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("console", stderr)
	var f consoleFlags
	f.register(fs)
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: console takes no arguments, got %q", errUsage, pos)
	}
	splitEnv(&f.dlqs, "IDEMQ_CONSOLE_DLQS")
	splitEnv(&f.workers, "IDEMQ_CONSOLE_WORKERS")
	if f.token == "" {
		f.token = os.Getenv(consoleTokenEnv)
	}
	switch {
	case f.token == "" && !f.readOnly:
		return fmt.Errorf("%w: replay and purge need a token: set %s (or --token), or start with --read-only", errUsage, consoleTokenEnv)
	case f.token != "" && len(f.token) < minTokenLen:
		return fmt.Errorf("%w: the token is %d bytes; use at least %d random ones (openssl rand -hex 24)", errUsage, len(f.token), minTokenLen)
	}
	cfg, closeAll, err := f.config(ctx, stderr)
	if err != nil {
		return err
	}
	defer closeAll()
	c, err := console.New(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	defer c.Close()
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	if f.prefix != "" {
		mux.Handle(f.prefix+"/", c)
		mux.Handle("/", http.RedirectHandler(f.prefix+"/", http.StatusFound))
	} else {
		mux.Handle("/", c)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	mode := "replay and purge need the token"
	if f.readOnly {
		mode = "read-only"
	}
	fmt.Fprintf(stdout, "idemq console: http://%s%s/ (%s; %d dead-letter stores, %d workers)\n", ln.Addr(), f.prefix, mode, len(cfg.Queues), len(cfg.Workers))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// config builds the console's Config from the flags: the dead-letter
// stores, and with --dsn the dedup store and the outbox of its schema.
func (f *consoleFlags) config(ctx context.Context, stderr io.Writer) (console.Config, func(), error) {
	cfg := console.Config{
		Token: f.token, ReadOnly: f.readOnly, Prefix: f.prefix,
		DSNs:   []string{f.brokers.store.dsn, f.brokers.amqpURL, f.brokers.sqsEndpoint},
		Logger: slog.New(slog.NewTextHandler(stderr, nil)),
	}
	var err error
	if cfg.Workers, err = f.workerList(); err != nil {
		return cfg, nil, err
	}
	closeAll := func() {}
	var failures interface {
		ForgetFailures(ctx context.Context, scope, key string) error
	}
	if f.brokers.store.dsn != "" {
		store, db, err := f.openStore(ctx)
		if err != nil {
			return cfg, nil, err
		}
		closeAll = func() { _ = db.Close() }
		retention := store.Config().Retention
		if f.retention != "" {
			if retention, err = time.ParseDuration(f.retention); err != nil {
				closeAll()
				return cfg, nil, fmt.Errorf("%w: --retention: %w", errUsage, err)
			}
		}
		cfg.Dedup = &sqlDedup{store: store, db: db, retention: retention}
		cfg.Outbox = &sqlOutbox{db: db, dialect: store.Config().Dialect, schema: store.Config().Schema}
		if f.brokers.scope != "" {
			failures = store.Driver()
		}
	} else if f.brokers.scope != "" {
		return cfg, nil, fmt.Errorf("%w: --scope needs --dsn, the store whose failure counts it names", errUsage)
	}
	if cfg.Queues, err = f.queues(failures); err != nil {
		closeAll()
		return cfg, nil, err
	}
	return cfg, closeAll, nil
}

// openStore opens the dedup store of --dsn and its database.
func (f *consoleFlags) openStore(ctx context.Context) (*sqldedup.Store, *sql.DB, error) {
	sf := f.brokers.store
	dialect, source, err := dialectOf(sf.dsn)
	if err != nil {
		return nil, nil, err
	}
	if dialect == sqldedup.SQLite && sf.schema != "" {
		return nil, nil, fmt.Errorf("%w: --schema is for PostgreSQL; SQLite has none", errUsage)
	}
	cfg := sqldedup.Config{Dialect: dialect, Schema: sf.schema, Table: sf.table}
	if _, err := sqldedup.New(&sql.DB{}, cfg); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	db, err := openSQL(ctx, dialect, source, existingDB, sf.table)
	if err != nil {
		return nil, nil, err
	}
	store, err := sqldedup.New(db, cfg)
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("%w: %w", errUsage, err), db.Close())
	}
	return store, db, nil
}

// sqlDedup reads the processed-messages table for the console: the
// store's Report, and from the table itself the stored results, the
// failure counts and, on PostgreSQL, the partitions and the transactions
// claiming now.
type sqlDedup struct {
	store     *sqldedup.Store
	db        *sql.DB
	retention time.Duration
}

func (d *sqlDedup) DedupStats(ctx context.Context) (console.DedupStats, error) {
	r, err := d.store.Report(ctx)
	if err != nil {
		return console.DedupStats{}, noTable(err, tableName(d.store.Config()))
	}
	st := console.DedupStats{TableReport: r, Retention: d.retention}
	c := d.store.Config()
	table := quoteTable(c, c.Table)
	if st.Results, err = countByScope(ctx, d.db, `SELECT scope, count(*) FROM `+table+` WHERE result IS NOT NULL GROUP BY scope`); err != nil {
		return st, err
	}
	if st.Failing, err = countByScope(ctx, d.db, `SELECT scope, count(*) FROM `+quoteTable(c, c.Table+"_failures")+` GROUP BY scope`); err != nil && !isNoTable(err) {
		return st, err
	}
	if c.Dialect == sqldedup.Postgres {
		if st.Partitions, err = partitions(ctx, d.db, table); err != nil {
			return st, err
		}
		if st.Claiming, err = claiming(ctx, d.db, table); err != nil {
			return st, err
		}
	}
	return st, nil
}

// quoteTable is table of c's schema as a statement names it.
func quoteTable(c sqldedup.Config, table string) string {
	if c.Dialect == sqldedup.Postgres {
		return `"` + c.Schema + `"."` + table + `"`
	}
	return `"` + table + `"`
}

func countByScope(ctx context.Context, db *sql.DB, query string) (map[string]int64, error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var scope string
		var n int64
		if err := rows.Scan(&scope, &n); err != nil {
			return nil, err
		}
		out[scope] = n
	}
	return out, rows.Err()
}

// claiming counts the open transactions, other than this session's, that
// hold or wait for a write lock on table or one of its partitions: each has
// claimed (or cleans up) keys not committed yet. pg_locks shows every
// role's locks, pg_stat_activity another role's transaction start only to
// pg_read_all_stats: those count as Hidden.
func claiming(ctx context.Context, db *sql.DB, table string) (*console.Claiming, error) {
	var c console.Claiming
	var oldest sql.NullTime
	err := db.QueryRowContext(ctx, `SELECT count(DISTINCT l.pid), count(DISTINCT l.pid) FILTER (WHERE a.xact_start IS NULL), min(a.xact_start)
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid()
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND (l.relation = $1::regclass OR l.relation IN (SELECT relid FROM pg_partition_tree($1::regclass)))`,
		table).Scan(&c.Transactions, &c.Hidden, &oldest)
	if err != nil {
		return nil, fmt.Errorf("read the transactions claiming in %s: %w", table, err)
	}
	c.Oldest = oldest.Time
	return &c, nil
}

// partitions lists the partitions of table from PostgreSQL's catalog, nil
// when it has none.
func partitions(ctx context.Context, db *sql.DB, table string) ([]console.Partition, error) {
	rows, err := db.QueryContext(ctx, `SELECT c.oid::regclass::text, coalesce(pg_get_expr(c.relpartbound, c.oid), ''),
		greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = to_regclass($1) ORDER BY 1`, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []console.Partition
	for rows.Next() {
		var p console.Partition
		if err := rows.Scan(&p.Name, &p.Bound, &p.Rows, &p.Bytes); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// sqlOutbox reads the outbox table of the store's schema for the console.
type sqlOutbox struct {
	db      *sql.DB
	dialect sqldedup.Dialect
	schema  string
}

func (o *sqlOutbox) OutboxStats(ctx context.Context) (console.OutboxStats, error) {
	var schema outbox.Schema
	table := outbox.Table
	if o.dialect == sqldedup.Postgres {
		schema, table = outbox.Schema(o.schema), o.schema+"."+outbox.Table
	}
	c, err := schema.Counts(ctx, o.db, o.dialect)
	if err != nil {
		return console.OutboxStats{}, noTable(err, outboxTable)
	}
	st := console.OutboxStats{Table: table, Pending: c.Pending, Failing: c.Failing, Parked: c.Parked, Sent: c.Sent,
		OldestPending: c.OldestPending, OldestParked: c.OldestParked}
	// state 1 is sent (sinks/outbox); SQLite keeps Unix milliseconds.
	q, arg := `SELECT count(*) FROM "`+o.schema+`"."`+outbox.Table+`" WHERE state = 1 AND sent_at > now() - interval '1 minute'`, []any(nil)
	if o.dialect == sqldedup.SQLite {
		q, arg = `SELECT count(*) FROM `+outbox.Table+` WHERE state = 1 AND sent_at > $1`, []any{time.Now().Add(-time.Minute).UnixMilli()}
	}
	if err := o.db.QueryRowContext(ctx, q, arg...).Scan(&st.SentLastMinute); err != nil {
		st.SentLastMinute = -1
	}
	return st, nil
}
