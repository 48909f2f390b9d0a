// Command notify is a small notification worker on RabbitMQ and Redis: it
// consumes notification messages from a queue and delivers each one to a
// webhook (an email or SMS vendor's HTTP API, say), once in effect, although
// RabbitMQ delivers at least once and the producer sends some twice.
//
//	bash testdata/services/services.sh up redis rabbitmq
//	go run ./examples/notify -publish 200 -idle 2s
//
// A webhook cannot join a database transaction, so the worker uses idemq's
// lease path: consumer.Leased with the Redis store (dedup/redisdedup) claims
// each message's key with a token, keeps the lease alive while the webhook
// call runs, marks the key done, and only then acknowledges the message. The
// webhook sink (sinks/webhook) sends the key as an Idempotency-Key header on
// every attempt, answers 2xx as done, retries 409/429/5xx and timeouts with
// backoff (honouring Retry-After), and dead-letters other 4xx at once.
//
// Without -webhook, the worker starts a demo receiver on 127.0.0.1 that
// behaves like a vendor: it deduplicates by Idempotency-Key, and answers the
// first attempt of every seventh notification with 503 to show the retries.
// It prints what it received.
//
// The remaining window: if the worker dies after the vendor accepted a
// notification and before Redis marked it done, the notification is sent
// again once its lease expires, with the same Idempotency-Key. A vendor that
// deduplicates by that key (like the demo receiver) sends it once.
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
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/sinks/webhook"
	"github.com/idemq/idemq/sources/amqpsource"
)

// Notification is the message body.
type Notification struct {
	To       string `json:"to"`
	Template string `json:"template"`
	Order    int    `json:"order"`
}

// options configure one run of the worker.
type options struct {
	amqpURL, redisURL string
	queue, name       string
	webhookURL        string
	publish           int
	idle              time.Duration
	concurrency       int
	lease             time.Duration
	log               *slog.Logger
}

func main() {
	o := options{log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()}))}
	flag.StringVar(&o.amqpURL, "amqp", "", "RabbitMQ URL (default: $TEST_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/)")
	flag.StringVar(&o.redisURL, "redis", "", "Redis URL (default: $TEST_REDIS_URL, else redis://127.0.0.1:6379/0)")
	flag.StringVar(&o.queue, "queue", "idemq.example.notify", "queue to consume (declared if missing)")
	flag.StringVar(&o.name, "name", "notify", "consumer name: the scope of the keys in Redis")
	flag.StringVar(&o.webhookURL, "webhook", "", "webhook URL (default: a demo receiver on 127.0.0.1)")
	flag.IntVar(&o.publish, "publish", 0, "publish this many notifications before consuming")
	flag.DurationVar(&o.idle, "idle", 0, "exit after the queue was idle this long (0: run until interrupted)")
	flag.IntVar(&o.concurrency, "concurrency", 8, "notifications handled at once")
	flag.DurationVar(&o.lease, "lease", 30*time.Second, "lease on a notification while its webhook call runs")
	flag.Parse()
	if o.amqpURL == "" {
		o.amqpURL = envOr("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	}
	if o.redisURL == "" {
		o.redisURL = envOr("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "notify:", err)
		os.Exit(1)
	}
}

// run consumes notifications until ctx is done or the queue was idle for
// o.idle, publishing first if asked.
func run(ctx context.Context, o options, out io.Writer) error {
	var demo *receiver
	if o.webhookURL == "" {
		var err error
		if demo, err = startReceiver(); err != nil {
			return err
		}
		defer demo.close()
		o.webhookURL = demo.url + "/notifications"
	}

	// The lease store.
	ropts, err := redis.ParseURL(o.redisURL)
	if err != nil {
		return fmt.Errorf("redis URL: %w", err)
	}
	rdb := redis.NewClient(ropts)
	defer rdb.Close()
	store, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		return err
	}

	// The effect: one webhook call per attempt, always with the message's
	// key as Idempotency-Key.
	sink, err := webhook.New(webhook.Config{
		URL:     o.webhookURL,
		Header:  http.Header{"Authorization": {"Bearer demo-token"}},
		Timeout: 5 * time.Second,
		Logger:  o.log,
	})
	if err != nil {
		return err
	}
	send := consumer.JSON(func(ctx context.Context, _ *consumer.Message, n Notification) error {
		if n.To == "" {
			return consumer.Permanent(errors.New("notification without a recipient"))
		}
		body, err := json.Marshal(map[string]any{"to": n.To, "template": n.Template, "vars": map[string]int{"order": n.Order}})
		if err != nil {
			return consumer.Permanent(err)
		}
		return sink.Send(ctx, webhook.Request{Body: body})
	})

	rc := consumer.Config{
		Name:        o.name,
		Concurrency: o.concurrency,
		Retry:       consumer.RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second},
		Logger:      o.log,
	}
	src, err := amqpsource.New(ctx, amqpsource.Config{
		URL:      o.amqpURL,
		Queue:    o.queue,
		Prefetch: amqpsource.PrefetchFor(rc),
		Declare:  &amqpsource.Topology{QueueType: amqpsource.QueueTypeQuorum},
		Logger:   o.log,
	})
	if err != nil {
		return err
	}
	defer src.Close()
	rc.KeyFunc = consumer.RequireKey

	if o.publish > 0 {
		if err := publish(ctx, o); err != nil {
			return err
		}
		fmt.Fprintf(out, "published %d notifications (%d of them twice)\n", o.publish, (o.publish+9)/10)
	}

	r, err := consumer.NewRunner(src, consumer.Leased(store, send, consumer.LeaseOptions{Lease: o.lease}), rc)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.idle > 0 {
		go func() {
			if r.WaitIdle(runCtx, o.idle) == nil {
				cancel()
			}
		}()
	}
	if err := r.Run(runCtx); err != nil {
		return err
	}

	s := r.Stats()
	fmt.Fprintf(out, "handled %d, duplicates %d, retried %d, dead-lettered %d\n", s.Handled, s.Duplicates, s.Retried, s.DeadLettered)
	if demo != nil {
		requests, sent, absorbed := demo.stats()
		fmt.Fprintf(out, "receiver: %d requests, %d notifications sent, %d repeated keys absorbed\n", requests, sent, absorbed)
	}
	return nil
}

// publish publishes o.publish notifications, every tenth one twice (as a
// producer that retries would), and waits for the broker's confirms. Their
// keys carry a fresh run id, so that every run with -publish sends new
// notifications.
func publish(ctx context.Context, o options) error {
	conn, err := dial(o.amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	runID := randomID()
	var confirms []*amqp.DeferredConfirmation
	send := func(n int) error {
		body, err := json.Marshal(Notification{To: fmt.Sprintf("user%d@example.com", n), Template: "order-shipped", Order: n})
		if err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", o.queue, true, false, amqp.Publishing{
			Headers:      amqp.Table{amqpsource.DefaultKeyHeader: "notify-" + runID + "-" + strconv.Itoa(n)},
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			Body:         body,
		})
		confirms = append(confirms, dc)
		return err
	}
	for n := range o.publish {
		if err := send(n); err != nil {
			return err
		}
		if n%10 == 0 {
			if err := send(n); err != nil { // the producer retried
				return err
			}
		}
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return errors.Join(errors.New("publish not confirmed"), err)
		}
	}
	return nil
}

// receiver is the demo webhook receiver: a vendor that deduplicates by
// Idempotency-Key and fails the first attempt of every seventh notification.
type receiver struct {
	url string
	srv *http.Server

	mu       sync.Mutex
	requests int
	absorbed int            // requests for keys already sent
	seen     map[string]int // requests per key
	sent     map[string]bool
}

func startReceiver() (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{url: "http://" + ln.Addr().String(), seen: map[string]int{}, sent: map[string]bool{}}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	var n struct {
		Vars struct {
			Order int `json:"order"`
		} `json:"vars"`
	}
	_ = json.NewDecoder(req.Body).Decode(&n)
	key := req.Header.Get("Idempotency-Key")
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	r.seen[key]++
	switch {
	case r.sent[key]:
		// Already sent: answer as the first time, send nothing.
		r.absorbed++
		w.WriteHeader(http.StatusOK)
	case n.Vars.Order%7 == 0 && r.seen[key] == 1:
		http.Error(w, "try again", http.StatusServiceUnavailable)
	default:
		r.sent[key] = true
		w.WriteHeader(http.StatusOK)
	}
}

// stats returns the requests received, the notifications sent, and the
// requests for keys already sent (repeats the receiver absorbed).
func (r *receiver) stats() (requests, sent, absorbed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests, len(r.sent), r.absorbed
}

func (r *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func logLevel() slog.Level {
	if os.Getenv("IDEMQ_LOG") == "debug" {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// dial connects to RabbitMQ at rawURL. The errors of a malformed URL quote
// it, password included, so dial reports the URL redacted instead.
func dial(rawURL string) (*amqp.Connection, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, errors.New("the RabbitMQ URL does not parse")
	}
	conn, err := amqp.Dial(rawURL)
	if err != nil {
		return nil, fmt.Errorf("dialing RabbitMQ at %s: %w", u.Redacted(), err)
	}
	return conn, nil
}
