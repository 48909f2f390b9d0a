package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/idemq/idemq/cmd/idemq-demo/internal/checkout"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/webhook"
)

// chainName is the notifier's consumer name: the scope of its leases and
// the first part of the Idempotency-Key it sends.
const chainName = "notify"

// relayCrashRate is the fraction of the relay's confirmed batches whose
// row update is lost, as if the relay died between the broker's confirm
// and the update: the rows are published again with the same ids.
const relayCrashRate = 0.1

// chain is the demo's second hop. The checkout workers publish an "order
// charged" event with outbox.Publish in each charge's transaction; an
// outbox relay in the supervisor publishes the committed events to an
// in-process broker (memsource, with injected duplicate deliveries); a
// notifier (an idemq runner on the lease path, over an in-memory lease
// store) sends each event to a webhook receiver on 127.0.0.1 through
// sinks/webhook. The receiver counts the notifications per
// Idempotency-Key and per order.
type chain struct {
	topic  string
	broker *memsource.Broker
	relay  *outbox.Relay
	pub    *crashingPublisher
	recv   *receiver
	runner *consumer.Runner
	stop   func() // stops the relay and the notifier, and waits for them
}

// startChain creates the events' outbox table in store, and starts the
// relay, the notifier and the receiver.
func startChain(ctx context.Context, store checkout.Store, runID string, seed uint64) (*chain, error) {
	c := &chain{topic: "idemq-demo-charged-" + runID}
	if err := checkout.EnableEvents(ctx, store, c.topic); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	c.broker = memsource.New(memsource.Config{VisibilityTimeout: time.Second, Seed: seed})
	c.broker.Inject(memsource.Fault{Kind: memsource.Redelivered, Probability: 0.02, Times: -1})
	c.broker.Inject(memsource.Fault{Kind: memsource.ConcurrentDuplicate, Probability: 0.02, Times: -1})
	c.pub = &crashingPublisher{broker: c.broker, topic: c.topic, rng: rand.New(rand.NewPCG(seed, 0x0b0))}
	cfg := outbox.Config{BatchSize: 50, PollInterval: 50 * time.Millisecond, InitialBackoff: 10 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	var err error
	switch st := store.(type) {
	case *checkout.SQLiteStore:
		c.relay, err = outbox.NewSQLiteRelay(st.DB, c.pub, cfg)
	case *checkout.PostgresStore:
		c.relay, err = outbox.NewRelay(st.Pool, c.pub, cfg)
	default:
		err = fmt.Errorf("no outbox relay for a %T", store)
	}
	if err == nil {
		c.recv, err = startReceiver()
	}
	if err == nil {
		err = c.newNotifier()
	}
	if err != nil {
		if c.recv != nil {
			c.recv.close()
		}
		_ = c.broker.Close()
		return nil, fmt.Errorf("demo: %w", err)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.relay.Run(rctx) })
	wg.Go(func() { _ = c.runner.Run(rctx) })
	var once sync.Once
	c.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			c.recv.close()
			_ = c.broker.Close()
		})
	}
	return c, nil
}

// newNotifier creates the notifier: a runner on the lease path (over an
// in-memory lease store) that sends each event to the receiver.
func (c *chain) newNotifier() error {
	sink, err := webhook.New(webhook.Config{URL: c.recv.url, Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	leases, err := memdedup.New(memdedup.Config{})
	if err != nil {
		return err
	}
	c.runner, err = consumer.NewRunner(c.broker.Source(c.topic),
		consumer.Leased(leases.Leases(), sink.Handler(), consumer.LeaseOptions{Lease: 5 * time.Second}),
		consumer.Config{Name: chainName, Concurrency: 4, BatchSize: 10, Logger: slog.New(slog.DiscardHandler),
			Retry: consumer.RetryPolicy{InitialBackoff: 50 * time.Millisecond, MaxBackoff: time.Second}})
	return err
}

// settled reports whether every order of n was notified and the relay has
// nothing left to publish.
func (c *chain) settled(ctx context.Context, n int) bool {
	if c.recv.orders() < n {
		return false
	}
	counts, err := c.relay.Counts(ctx)
	return err == nil && counts.Pending == 0 && c.broker.Stats(c.topic).Pending == 0
}

// finish stops the chain and adds its figures to sum.
func (c *chain) finish(ctx context.Context, sum *Summary) {
	c.stop()
	sum.Chain = true
	if counts, err := c.relay.Counts(ctx); err == nil {
		sum.EventsSent, sum.EventsPending = counts.Sent, counts.Pending
	}
	sum.RelayCrashes, sum.RelayResent = c.pub.figures()
	st := c.runner.Stats()
	sum.EventDeliveries, sum.EventDuplicatesAbsorbed = st.Received, st.Duplicates
	sum.Notified, sum.NotifyCalls, sum.NotifiedTwice, sum.NotifiedTotal = c.recv.figures()
}

// crashingPublisher publishes outbox rows to the in-process broker (the
// stable id as the message's key, the partition key as its partition key)
// and, for relayCrashRate of the batches, reports an outage after the
// broker took them: the relay keeps the rows pending and publishes them
// again, as after a crash between the confirm and the row update.
type crashingPublisher struct {
	broker *memsource.Broker
	topic  string

	mu              sync.Mutex
	rng             *rand.Rand
	crashes, resent int
}

func (p *crashingPublisher) Publish(_ context.Context, msgs []outbox.Message) error {
	out := make([]memsource.Outgoing, len(msgs))
	for i, m := range msgs {
		out[i] = memsource.Outgoing{Key: m.ID, Body: m.Body, Headers: m.Headers, PartitionKey: m.Key}
	}
	p.broker.Publish(p.topic, out...)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rng.Float64() < relayCrashRate {
		p.crashes++
		p.resent += len(msgs)
		return fmt.Errorf("%w: demo: the relay lost its update after the broker confirmed", outbox.ErrUnavailable)
	}
	return nil
}

func (p *crashingPublisher) figures() (crashes, resent int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.crashes, p.resent
}

// receiver is the webhook endpoint of the notifications: it answers 200 and
// counts the requests per Idempotency-Key and per order.
type receiver struct {
	url string
	srv *http.Server

	mu     sync.Mutex
	calls  map[string]int   // per Idempotency-Key
	amount map[string]int64 // per order ID: its amount
	keys   map[string]int   // per order ID: distinct keys that notified it
}

func startReceiver() (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("start the webhook receiver: %w", err)
	}
	r := &receiver{url: "http://" + ln.Addr().String() + "/notify",
		calls: map[string]int{}, amount: map[string]int64{}, keys: map[string]int{}}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	var o checkout.Order
	if err == nil {
		err = json.Unmarshal(body, &o)
	}
	key := req.Header.Get(webhook.DefaultKeyHeader)
	if err != nil || key == "" || o.ID == "" {
		http.Error(w, "want an order and an Idempotency-Key", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.calls[key]++
	if r.calls[key] == 1 {
		r.keys[o.ID]++
		r.amount[o.ID] = o.Amount
	}
	r.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// orders returns the number of distinct orders notified.
func (r *receiver) orders() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.keys)
}

// figures returns the distinct orders notified, the requests, the keys
// sent more than once plus the orders notified under more than one key,
// and the sum of the notified orders' amounts.
func (r *receiver) figures() (orders, calls, twice int, total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.calls {
		calls += n
		if n > 1 {
			twice++
		}
	}
	for id, n := range r.keys {
		if n > 1 {
			twice++
		}
		total += r.amount[id]
	}
	return len(r.keys), calls, twice, total
}

func (r *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		_ = r.srv.Close()
	}
}
