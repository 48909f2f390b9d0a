// Command observability runs a worker with OpenTelemetry metrics and traces
// (consumer/otelidemq) and serves, over HTTP, its readiness
// (Runner.Health) on /healthz and its metrics on /metrics through the
// OpenTelemetry Prometheus exporter.
//
//	go run ./examples/observability -publish 500
//	curl -s 127.0.0.1:9464/healthz
//	curl -s 127.0.0.1:9464/metrics | grep -E '^(idemq|messaging)_'
//
// It needs no service: the broker is memsource with scripted chaos (dropped
// acknowledgements, duplicate deliveries) and the store is in memory, so the
// duplicate, retry and dead-letter metrics move. Swap in a real source and
// pgdedup for production; the hook and the HTTP handlers stay the same.
//
// Log lines go through a slog handler that adds the trace and span ids of
// the context they are logged with: the runner logs with the message's
// context, so each line about a message names its trace.
package main

import (
	"context"
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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/otelidemq"
	"github.com/idemq/idemq/internal/memstore"
	"github.com/idemq/idemq/sources/memsource"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9464", "HTTP address of /healthz and /metrics")
	publish := flag.Int("publish", 500, "messages to publish (some twice)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("serving http://%s/healthz and /metrics; Ctrl-C to stop\n", ln.Addr())
	if err := run(ctx, ln, *publish, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run publishes n messages, runs the worker until ctx is done, and serves
// /healthz and /metrics on ln meanwhile.
func run(ctx context.Context, ln net.Listener, n int, logs io.Writer) (err error) {
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

	hook, err := otelidemq.New(otelidemq.Config{TracerProvider: tp, MeterProvider: mp, ConsumerGroup: "observability"})
	if err != nil {
		return err
	}

	broker := memsource.New(memsource.Config{VisibilityTimeout: 200 * time.Millisecond, Seed: 7})
	defer broker.Close()
	broker.Inject(memsource.Fault{Kind: memsource.FaultDropAck, Probability: 0.05, Times: -1})
	broker.Inject(memsource.Fault{Kind: memsource.FaultDuplicate, Probability: 0.05, Times: -1})
	for i := range n {
		out := memsource.Outgoing{Key: "order-" + strconv.Itoa(i), Body: []byte(`{"amount":1}`)}
		broker.Publish("orders", out)
		if i%10 == 0 {
			broker.Publish("orders", out) // the producer sends it again
		}
	}

	store, err := memstore.New(memstore.Config{})
	if err != nil {
		return err
	}
	handler := func(ctx context.Context, _ *memstore.Tx, m *consumer.Message) error {
		switch {
		case m.Key == "order-13":
			return consumer.Permanent(errors.New("unknown customer"))
		case m.Attempt == 1 && len(m.Key)%7 == 0:
			return errors.New("payment provider busy")
		}
		return nil
	}
	log := slog.New(traceHandler{slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})})
	runner, err := consumer.NewRunner(broker.Source("orders"), consumer.Transactional(store, handler), consumer.Config{
		Name: "observability", BatchSize: 100, Logger: log,
		Retry: consumer.RetryPolicy{InitialBackoff: 10 * time.Millisecond},
		Hooks: []consumer.Hook{hook},
	})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		h := runner.Health()
		w.Header().Set("Content-Type", "application/json")
		if !h.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(h)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	return runner.Run(ctx)
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
