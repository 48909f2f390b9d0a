// Command observability is an orders worker on Kafka and PostgreSQL with
// OpenTelemetry traces and metrics (consumer/otelidemq), served over HTTP
// next to the probes an orchestrator calls:
//
//	make services   # or: bash testdata/services/services.sh up postgres kafka
//	go run ./examples/observability -publish 500
//	curl -s 127.0.0.1:9464/readyz
//	curl -s 127.0.0.1:9464/metrics | grep -E '^(idemq|messaging)_'
//
// Everything in it is what a production worker uses, so it can be copied
// whole: kafkasource, pgdedup, the hook in consumer.Config.Hooks, the
// Kafka lag (Hook.ObserveLag) and dedup table (Hook.ObserveDedup) gauges,
// the OpenTelemetry Prometheus exporter on /metrics, and
// consumer.HealthHandler on /livez and /readyz. The tracer provider has no
// exporter: add yours (OTLP, for example) with sdktrace.WithBatcher.
//
// With -publish it first publishes that many orders, every tenth one twice
// (a retrying producer), one that is not JSON (dead-lettered) and some
// that fail their first attempt (retried), so that the duplicate, retry and
// dead-letter metrics move. It runs until interrupted.
//
// Log lines go through a slog handler that adds the trace and span ids of
// the context they are logged with: the runner logs with the message's
// context, so each line about a message names its trace.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sources/kafkasource"
)

// Order is the message body.
type Order struct {
	Amount int64 `json:"amount"` // cents
}

// options configure one run of the worker.
type options struct {
	brokers      []string
	databaseURL  string
	topic, group string
	schema       string
	publish      int
	janitor      time.Duration // pgdedup.Config.CleanupInterval and StatsInterval
}

func main() {
	var o options
	addr := flag.String("addr", "127.0.0.1:9464", "HTTP address of /livez, /readyz and /metrics")
	brokers := flag.String("brokers", envOr("TEST_KAFKA_BROKERS", "127.0.0.1:9092"), "comma-separated Kafka bootstrap brokers")
	flag.StringVar(&o.databaseURL, "db", envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable"), "PostgreSQL URL")
	flag.StringVar(&o.topic, "topic", "idemq.example.orders", "topic to consume (created if missing, with <topic>.dlq)")
	flag.StringVar(&o.group, "group", "idemq-example-observability", "consumer group, also the deduplication scope")
	flag.StringVar(&o.schema, "schema", "idemq_example_observability", "PostgreSQL schema for the orders and the dedup records")
	flag.IntVar(&o.publish, "publish", 0, "publish this many orders before consuming")
	flag.DurationVar(&o.janitor, "janitor", time.Minute, "how often the dedup table is cleaned up and measured for its gauges")
	flag.Parse()
	o.brokers = strings.Split(*brokers, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("serving http://%s/readyz, /livez and /metrics; Ctrl-C to stop\n", ln.Addr())
	if err := run(ctx, o, ln, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "observability:", err)
		os.Exit(1)
	}
}

// run sets up the topic and the database, publishes if asked, serves HTTP
// on ln and consumes until ctx is done.
func run(ctx context.Context, o options, ln net.Listener, logs io.Writer) (err error) {
	log := slog.New(traceHandler{slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})})

	// The SDK is the application's: a Prometheus exporter as the meter
	// provider's reader, and a tracer provider (add an exporter to it).
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	tp := sdktrace.NewTracerProvider()
	// Shutdown flushes what the providers still hold: its error is run's.
	defer func() {
		err = errors.Join(err, tp.Shutdown(context.WithoutCancel(ctx)), mp.Shutdown(context.WithoutCancel(ctx)))
	}()
	// The system, the consumer group and the server of a message's spans and
	// metrics come from the message (kafkasource fills
	// consumer.Message.Broker); ConsumerGroup also labels the lag gauge,
	// which is read from the brokers, not from messages.
	hook, err := otelidemq.New(otelidemq.Config{TracerProvider: tp, MeterProvider: mp, ConsumerGroup: o.group})
	if err != nil {
		return err
	}

	setupCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := kafkasource.CreateTopics(setupCtx, nil, o.brokers,
		kafkasource.TopicSpec{Name: o.topic, Partitions: 4},
		kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(o.topic), Partitions: 1},
	); err != nil {
		return err
	}
	const concurrency = 4
	poolCfg, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return err
	}
	// A connection per lane, plus room for the janitor: the runner refuses
	// a smaller pool.
	poolCfg.MaxConns = concurrency + 2
	pool, err := pgxpool.NewWithConfig(setupCtx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := setupDatabase(setupCtx, pool, o, log)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if o.publish > 0 {
		if err := publish(setupCtx, tp, o); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}

	src, err := kafkasource.New(ctx, kafkasource.Config{
		Brokers: o.brokers, Topics: []string{o.topic}, GroupID: o.group,
		SessionTimeout: 10 * time.Second, HeartbeatInterval: time.Second,
		Logger: log,
	})
	if err != nil {
		return err
	}
	defer src.Close()

	// The gauges read the Kafka lag (one request per collection) and the
	// janitor's latest measurement of the dedup table.
	lag, err := hook.ObserveLag(src)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, lag.Unregister()) }()
	dedupStats, err := hook.ObserveDedup(store)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dedupStats.Unregister()) }()

	// The handler's context carries its span (the hook makes it), so an
	// effect it sends on joins the message's trace: a webhook sink with
	// webhook.Config{Propagator: otelidemq.Propagator()} writes it in the
	// request's headers, and outbox.Publish stores its W3C trace context
	// with the row.
	orders := pgx.Identifier{o.schema, "orders"}.Sanitize()
	handler := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, order Order) error {
		if m.Attempt == 1 && strings.HasSuffix(m.Key, "7") {
			return errors.New("payment provider busy") // retried
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+orders+` (key, amount) VALUES ($1, $2)`, m.Key, order.Amount)
		return err
	})
	runner, err := consumer.NewRunner(src, consumer.Transactional(store, handler), consumer.Config{
		Name: o.group, Concurrency: concurrency, BatchSize: 50, Logger: log,
		Retry: consumer.RetryPolicy{InitialBackoff: 10 * time.Millisecond},
		Hooks: []consumer.Hook{hook},
	})
	if err != nil {
		return err
	}

	health := consumer.HealthHandler(runner)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("GET /livez", health)
	mux.Handle("GET /readyz", health)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	janitorCtx, stopJanitor := context.WithCancel(ctx)
	janitorDone := make(chan error, 1)
	go func() { janitorDone <- store.RunJanitor(janitorCtx) }()
	defer func() {
		stopJanitor()
		if jerr := <-janitorDone; jerr != nil && !errors.Is(jerr, context.Canceled) {
			err = errors.Join(err, jerr)
		}
	}()
	return runner.Run(ctx)
}

// setupDatabase creates the schema, the orders table and the dedup table.
func setupDatabase(ctx context.Context, pool *pgxpool.Pool, o options, log *slog.Logger) (*pgdedup.Store, error) {
	ident := pgx.Identifier{o.schema}.Sanitize()
	for _, sql := range []string{
		`CREATE SCHEMA IF NOT EXISTS ` + ident,
		`CREATE TABLE IF NOT EXISTS ` + ident + `.orders (key text PRIMARY KEY, amount bigint NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return nil, err
		}
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: o.schema, CleanupInterval: o.janitor, StatsInterval: o.janitor, Logger: log})
	if err != nil {
		return nil, err
	}
	return store, store.Migrate(ctx)
}

// publish writes o.publish orders with unique keys (every tenth twice) and
// one body that is not JSON, each with the W3C trace context of a producer
// span, as an instrumented producer would.
func publish(ctx context.Context, tp trace.TracerProvider, o options) error {
	run := make([]byte, 4)
	_, _ = rand.Read(run)
	prefix := "order-" + hex.EncodeToString(run) + "-"
	w := &kafka.Writer{
		Addr: kafka.TCP(o.brokers...), Topic: o.topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond,
		Transport: &kafka.Transport{}, // fresh metadata: the topic may be new
	}
	defer w.Close()
	message := func(key string, body []byte) kafka.Message {
		pctx, span := tp.Tracer("producer").Start(ctx, "send "+o.topic, trace.WithSpanKind(trace.SpanKindProducer))
		defer span.End()
		headers := map[string]string{kafkasource.DefaultKeyHeader: key}
		propagation.TraceContext{}.Inject(pctx, propagation.MapCarrier(headers))
		m := kafka.Message{Key: []byte(key), Value: body}
		for k, v := range headers {
			m.Headers = append(m.Headers, kafka.Header{Key: k, Value: []byte(v)})
		}
		return m
	}
	var msgs []kafka.Message
	for n := range o.publish {
		body, _ := json.Marshal(Order{Amount: int64(100 + n%7)})
		m := message(prefix+strconv.Itoa(n), body)
		msgs = append(msgs, m)
		if n%10 == 0 {
			msgs = append(msgs, m) // the producer retried
		}
	}
	msgs = append(msgs, message(prefix+"garbled", []byte("not json")))
	return w.WriteMessages(ctx, msgs...)
}

// traceHandler adds the trace and span ids of the record's context.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
