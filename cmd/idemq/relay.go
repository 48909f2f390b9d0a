package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
		summary: "publish the committed rows of the outbox table (sinks/outbox) to a broker (--broker), or show their counts (--stats)",
		run:     runRelay,
	}
}

// migrateOutbox applies or prints the outbox table's migrations
// (idemq migrate --outbox), in schema ("": the first of the search path).
func migrateOutbox(ctx context.Context, dsn, schemaName string, print bool, stdout io.Writer) error {
	schema := outbox.Schema(schemaName)
	dialect, source, err := dialectOf(dsn)
	if err != nil {
		return err
	}
	if dialect == sqldedup.SQLite && schema != "" {
		return fmt.Errorf("%w: --schema is for PostgreSQL; SQLite has none", errUsage)
	}
	if print {
		s, err := schema.MigrationSQL(dialect)
		if err != nil {
			return err
		}
		fmt.Fprint(stdout, s)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	db, closeDB, err := openOutboxDB(ctx, dialect, source, createDB)
	if err != nil {
		return err
	}
	defer closeDB()
	before, err := outboxObjects(ctx, db, schema)
	if err != nil {
		return err
	}
	switch db := db.(type) {
	case *pgxpool.Pool:
		err = schema.Migrate(ctx, db)
	case *sql.DB:
		err = schema.MigrateSQL(ctx, db, dialect)
	}
	if err != nil {
		return err
	}
	after, err := outboxObjects(ctx, db, schema)
	if err != nil {
		return err
	}
	// The outbox's migrations are idempotent statements without a versions
	// table: what they applied is what they created.
	var created []string
	for _, o := range after {
		if !slices.Contains(before, o) {
			created = append(created, o)
		}
	}
	table := outbox.Table
	if schema != "" {
		table = string(schema) + "." + table
	}
	if len(created) == 0 {
		fmt.Fprintf(stdout, "%s (%s) is already up to date: no migration applied\n", table, dialect)
		return nil
	}
	fmt.Fprintf(stdout, "applied the outbox migrations to %s (%s), which created:\n", table, dialect)
	for _, o := range created {
		fmt.Fprintf(stdout, "  %s\n", o)
	}
	fmt.Fprintf(stdout, "%s (%s) is up to date\n", table, dialect)
	return nil
}

// outboxObjects lists the outbox's schema objects ("table idemq_outbox",
// "index ...", "trigger ...") in the database db (a *pgxpool.Pool, in the
// schema the migrations use: schema, or the first of the search path; or a
// SQLite *sql.DB), sorted.
func outboxObjects(ctx context.Context, db any, schema outbox.Schema) ([]string, error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		rows, err := d.Query(ctx, `
WITH s AS (SELECT coalesce(nullif($2, ''), current_schema()) AS name)
SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'i' THEN 'index' WHEN 'S' THEN 'sequence' ELSE 'relation' END || ' ' || c.relname
  FROM pg_class c, s WHERE c.relnamespace = to_regnamespace(quote_ident(s.name)) AND c.relname LIKE $1 || '%'
UNION ALL
SELECT 'trigger ' || t.tgname FROM pg_trigger t, s WHERE t.tgrelid = to_regclass(quote_ident(s.name) || '.' || $1) AND NOT t.tgisinternal
UNION ALL
SELECT 'function ' || p.proname FROM pg_proc p, s WHERE p.pronamespace = to_regnamespace(quote_ident(s.name)) AND p.proname LIKE $1 || '%'
ORDER BY 1`, outbox.Table, string(schema))
		if err != nil {
			return nil, fmt.Errorf("list the outbox's objects: %w", err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("list the outbox's objects: %w", err)
		}
		return out, nil
	case *sql.DB:
		rows, err := d.QueryContext(ctx, `SELECT type || ' ' || name FROM sqlite_master
  WHERE tbl_name = ? AND name NOT LIKE 'sqlite_autoindex%' ORDER BY 1`, outbox.Table)
		if err != nil {
			return nil, fmt.Errorf("list the outbox's objects: %w", err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var o string
			if err := rows.Scan(&o); err != nil {
				return nil, fmt.Errorf("list the outbox's objects: %w", err)
			}
			out = append(out, o)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("list the outbox's objects: %w", err)
		}
		return out, nil
	}
	return nil, fmt.Errorf("list the outbox's objects: unsupported database %T", db)
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
	stats := fs.Bool("stats", false, "print the outbox's row counts (pending, sent, parked) and exit")
	var cfg outbox.Config
	fs.IntVar(&cfg.BatchSize, "batch", 100, "rows claimed and published at once")
	fs.IntVar(&cfg.Concurrency, "concurrency", 1, "batches in flight at once (PostgreSQL only)")
	fs.DurationVar(&cfg.PollInterval, "poll", time.Second, "poll interval (the fallback of LISTEN/NOTIFY on PostgreSQL)")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", 10, "failed publishes after which a row is parked")
	fs.DurationVar(&cfg.Retention, "retention", 24*time.Hour, "how long sent rows are kept; negative deletes them when sent")
	fs.StringVar((*string)(&cfg.Schema), "schema", "", "PostgreSQL schema of the outbox table (default: the first of the search path)")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, pos)
	}
	dialect, source, err := dialectOf(*dsn)
	if err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))

	var pub outbox.Publisher
	switch {
	case *stats:
		pub = statsOnly{}
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
	if *stats {
		c, err := r.Counts(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pending         %d\n", c.Pending)
		fmt.Fprintf(stdout, "sent            %d\n", c.Sent)
		fmt.Fprintf(stdout, "parked          %d\n", c.Parked)
		fmt.Fprintf(stdout, "oldest pending  %s\n", c.OldestPending.Round(time.Millisecond))
		return nil
	}
	fmt.Fprintf(stderr, "idemq relay: publishing %s rows to %s; Ctrl-C stops\n", outbox.Table, *broker)
	return r.Run(ctx)
}

// statsOnly is the publisher of `idemq relay --stats`, which publishes
// nothing.
type statsOnly struct{}

func (statsOnly) Publish(context.Context, []outbox.Message) error {
	return fmt.Errorf("%w: --stats publishes nothing", outbox.ErrUnavailable)
}
