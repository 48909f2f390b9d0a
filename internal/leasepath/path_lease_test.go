package leasepath_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/webhook"
	"github.com/idemq/idemq/sinks/webhook/webhooktest"
)

// These tests drive the whole lease path: memsource → Runner → Leased with
// the Redis store (real Redis) → the webhook sink → an httptest receiver that
// counts requests per Idempotency-Key.

const leaseTestTimeout = 60 * time.Second

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// newRedisStore returns a Redis lease store with its own client (its own
// connection pool, as a separate process would have).
func newRedisStore(t *testing.T) (*redisdedup.Store, *redis.Client) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Redis; skipped with -short")
	}
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatalf("parse Redis URL: %v", err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s, rdb
}

// leaseEnv is one test's broker, topic, consumer name and webhook receiver.
type leaseEnv struct {
	batch  int // runner batch size; 0 means 1
	broker *memsource.Broker
	topic  string
	name   string
	rcv    *webhooktest.Receiver
	sink   *webhook.Sink
}

func newLeaseEnv(t *testing.T, cfg memsource.Config, respond func(webhooktest.Call) webhooktest.Response) *leaseEnv {
	t.Helper()
	b := memsource.New(cfg)
	t.Cleanup(func() { _ = b.Close() })
	rcv := webhooktest.New(t, respond)
	sink, err := webhook.New(webhook.Config{URL: rcv.URL() + "/notify", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &leaseEnv{broker: b, topic: randomName("topic"), name: randomName("lease-test"), rcv: rcv, sink: sink}
}

// fastRetry keeps the tests' retries quick.
var fastRetry = consumer.RetryPolicy{InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, MaxAttempts: 5}

// runner builds a runner on a new Source of the env's topic.
func (e *leaseEnv) runner(t *testing.T, store dedupdriver.LeaseStore, h consumer.Handler, opts consumer.LeaseOptions, concurrency int) *consumer.Runner {
	t.Helper()
	return e.runnerOn(t, e.topic, store, h, opts, concurrency)
}

// runnerOn builds a runner on a new Source of topic, with the env's consumer
// name: a runner on another topic deduplicates against the env's runners,
// like a second delivery path of the same messages.
func (e *leaseEnv) runnerOn(t *testing.T, topic string, store dedupdriver.LeaseStore, h consumer.Handler, opts consumer.LeaseOptions, concurrency int) *consumer.Runner {
	t.Helper()
	src := e.broker.Source(topic)
	t.Cleanup(func() { _ = src.Close() })
	if h == nil {
		h = e.sink.Handler()
	}
	r, err := consumer.NewRunner(src, consumer.Leased(store, h, opts), consumer.Config{
		Name:         e.name,
		Concurrency:  concurrency,
		BatchSize:    e.batch,
		Retry:        fastRetry,
		DrainTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (e *leaseEnv) publish(key, body string, copies int) {
	e.publishTo(e.topic, key, body, copies)
}

func (e *leaseEnv) publishTo(topic, key, body string, copies int) {
	for range copies {
		e.broker.Publish(topic, memsource.Outgoing{Key: key, Body: []byte(body)})
	}
}

// settled reports whether every message published on the env's topic (and
// on the other topics given) was acknowledged or dead-lettered.
func (e *leaseEnv) settled(topics ...string) bool {
	for _, topic := range append(topics, e.topic) {
		if st := e.broker.Stats(topic); st.Published == 0 || st.Pending != 0 {
			return false
		}
	}
	return true
}

// key is the Idempotency-Key the env's runners send for message key k.
func (e *leaseEnv) key(k string) string { return e.name + ":" + k }

// bare is the message key inside an Idempotency-Key.
func bare(idempotencyKey string) string {
	_, k, _ := strings.Cut(idempotencyKey, ":")
	return k
}

// wantOncePerKey checks that the receiver applied each key exactly once and
// saw calls calls of it, and no other key.
func (e *leaseEnv) wantOncePerKey(t *testing.T, keys []string, calls int) {
	t.Helper()
	want := make([]string, len(keys))
	for i, k := range keys {
		want[i] = e.key(k)
		if got := e.rcv.Successes(e.key(k)); got != 1 {
			t.Errorf("key %s: %d successful webhook calls, want exactly 1", k, got)
		}
		if got := e.rcv.Calls(e.key(k)); got != calls {
			t.Errorf("key %s: %d webhook calls, want %d", k, got, calls)
		}
	}
	slices.Sort(want)
	if got := e.rcv.Keys(); !slices.Equal(got, want) {
		t.Errorf("receiver saw keys %v, want %v", got, want)
	}
}

func keysN(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return keys
}

// N deliveries of one message, one after another (redeliveries after the
// first is done, and acknowledgements lost after "done"): the webhook gets
// exactly one call per key.
func TestLeaseSequentialRedeliveries(t *testing.T) {
	store, _ := newRedisStore(t)
	env := newLeaseEnv(t, memsource.Config{VisibilityTimeout: 300 * time.Millisecond}, nil)
	keys := keysN("seq", 30)
	env.broker.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Topic: env.topic, Probability: 0.3, Times: -1})
	env.broker.Inject(memsource.Fault{Kind: memsource.Redelivered, Topic: env.topic, Probability: 0.3, Times: -1})
	r := env.runner(t, store, nil, consumer.LeaseOptions{}, 1)
	for _, k := range keys {
		env.publish(k, `{"to":"`+k+`"}`, 1)
	}
	runtest.RunUntil(t, func() bool { return env.settled() }, r)
	// The same messages published again later, by a producer retrying.
	for _, k := range keys {
		env.publish(k, `{"to":"`+k+`"}`, 2)
	}
	runtest.RunUntil(t, func() bool { return env.settled() }, r)

	env.wantOncePerKey(t, keys, 1)
	st := r.Stats()
	if st.Handled != uint64(len(keys)) || st.Duplicates < uint64(2*len(keys)) || st.DeadLettered != 0 {
		t.Fatalf("stats %+v: want %d handled, at least %d duplicates, none dead-lettered", st, len(keys), 2*len(keys))
	}
}

// N deliveries of each message at the same time, across several runner
// instances (each with its own Redis connections) competing on one topic,
// with the broker delivering messages to two of them at once: exactly one
// call per key, and never two calls of one key at the same moment.
func TestLeaseConcurrentRunners(t *testing.T) {
	env := newLeaseEnv(t, memsource.Config{}, func(c webhooktest.Call) webhooktest.Response {
		time.Sleep(5 * time.Millisecond) // widen the overlap
		return webhooktest.Response{}
	})
	keys := keysN("conc", 40)
	env.broker.Inject(memsource.Fault{Kind: memsource.ConcurrentDuplicate, Topic: env.topic, Probability: 0.5, Times: -1})
	opts := consumer.LeaseOptions{Lease: 5 * time.Second, InProgressDelay: 50 * time.Millisecond}
	var runners []*consumer.Runner
	for range 4 {
		store, _ := newRedisStore(t)
		runners = append(runners, env.runner(t, store, nil, opts, 4))
	}
	for _, k := range keys {
		env.publish(k, `{"to":"`+k+`"}`, 3)
	}
	runtest.RunUntil(t, func() bool { return env.settled() }, runners...)

	env.wantOncePerKey(t, keys, 1)
	if got := env.rcv.MaxConcurrent(); got != 1 {
		t.Fatalf("%d webhook calls of one key ran at once, want 1", got)
	}
	var handled, inProgressRetries uint64
	for _, r := range runners {
		st := r.Stats()
		handled += st.Handled
		inProgressRetries += st.Retried
	}
	if handled != uint64(len(keys)) {
		t.Fatalf("%d messages handled across runners, want %d", handled, len(keys))
	}
	t.Logf("%d keys × 3 copies over 4 runners: %d retries of copies found in progress", len(keys), inProgressRetries)
}

// Batches claim their keys in one round trip and keep the leases of queued
// messages alive while earlier ones run, even when the batch takes longer
// than a lease: every key's effect happens, none is lost to expiry, and no
// handler starts under a lease its worker does not hold.
//
// The lease is short (250 ms) so that a batch of ten outlasts it. On a loaded
// machine the whole test process is sometimes not scheduled for longer than
// that (timelines of failing runs showed 150 ms to 1 s without a single store
// reply or webhook call, while twenty leases were being refreshed every
// 50 ms). A webhook call in flight then outlives its lease, another worker
// claims the expired key and calls again: the documented lease window, which
// the downstream closes with the Idempotency-Key. So the test counts effects
// as a deduplicating downstream would (each key arrives, always under its
// one Idempotency-Key), allows a repeated call of a key only for a run whose
// lease the store then reported lost, and checks every handler start against
// what the store had told the workers so far (leaseAudit): a handler started
// without a grant, after its lease was reported lost, after the key was
// completed, or after another token claimed the key fails the test whatever
// the timing.
func TestLeaseBatchedClaims(t *testing.T) {
	env := newLeaseEnv(t, memsource.Config{}, func(c webhooktest.Call) webhooktest.Response {
		time.Sleep(40 * time.Millisecond) // a batch of 10 outlasts the lease
		return webhooktest.Response{}
	})
	env.batch = 10
	keys := keysN("batch", 30)
	env.broker.Inject(memsource.Fault{Kind: memsource.ConcurrentDuplicate, Topic: env.topic, Probability: 0.3, Times: -1})
	opts := consumer.LeaseOptions{Lease: 250 * time.Millisecond, RefreshInterval: 50 * time.Millisecond, InProgressDelay: 50 * time.Millisecond}
	audit := newLeaseAudit()
	var runners []*consumer.Runner
	for range 2 {
		store, _ := newRedisStore(t)
		runners = append(runners, env.runner(t, &auditedStore{Lease: store.Driver(), audit: audit}, audit.handler(env.sink.Handler()), opts, 1))
	}
	for range 2 { // each batch holds ten distinct keys
		for _, k := range keys {
			env.publish(k, `{"to":"`+k+`"}`, 1)
		}
	}
	runtest.RunUntil(t, func() bool { return env.settled() }, runners...)

	for _, v := range audit.violations {
		t.Error(v)
	}
	if audit.expiredStarts > 0 {
		t.Logf("%d handler starts came after their own refresher found the lease lost (their ctx was cancelled)", audit.expiredStarts)
	}
	lost := audit.lostRuns()
	want := make([]string, len(keys))
	for i, k := range keys {
		want[i] = env.key(k)
		if got := env.rcv.Successes(env.key(k)); got < 1 {
			t.Errorf("key %s: %d successful webhook calls, want at least 1", k, got)
		}
		calls := env.rcv.Calls(env.key(k))
		if calls > 1+lost[k] {
			t.Errorf("key %s: %d webhook calls, but only %d runs lost their lease: a repeat not explained by a lost lease", k, calls, lost[k])
		} else if calls > 1 {
			t.Logf("key %s: %d webhook calls under one Idempotency-Key after %d leases were lost (process starved past the lease)", k, calls, lost[k])
		}
	}
	slices.Sort(want)
	if got := env.rcv.Keys(); !slices.Equal(got, want) {
		t.Errorf("receiver saw Idempotency-Keys %v, want %v", got, want)
	}
	if audit.batches == 0 {
		t.Fatal("no batch claim was made")
	}
	for _, r := range runners {
		if st := r.Stats(); st.DeadLettered != 0 {
			t.Fatalf("dead-lettered: %+v", st)
		}
	}
}

// leaseSpy wraps a LeaseStore and counts what the runner did with it.
type leaseSpy struct {
	dedupdriver.Lease
	claims, refreshes, completes, completesLost atomic.Int64
	// completeHook, if set, replaces Complete.
	completeHook func(ctx context.Context, scope, key, token string, retention time.Duration) error
}

func (s *leaseSpy) Driver() dedupdriver.Lease { return s }

// Caps reports no capability: the spy counts one claim per message.
func (s *leaseSpy) Caps() dedupdriver.Caps { return dedupdriver.Caps{} }

func (s *leaseSpy) Claim(ctx context.Context, scope string, rec dedup.Record, token string, lease time.Duration) (dedup.Claim, error) {
	s.claims.Add(1)
	return s.Lease.Claim(ctx, scope, rec, token, lease)
}

func (s *leaseSpy) Refresh(ctx context.Context, scope, key, token string, lease time.Duration) error {
	s.refreshes.Add(1)
	return s.Lease.Refresh(ctx, scope, key, token, lease)
}

func (s *leaseSpy) Complete(ctx context.Context, scope, key, token string, retention time.Duration) error {
	s.completes.Add(1)
	var err error
	if s.completeHook != nil {
		err = s.completeHook(ctx, scope, key, token, retention)
	} else {
		err = s.Lease.Complete(ctx, scope, key, token, retention)
	}
	if errors.Is(err, dedup.ErrLeaseLost) {
		s.completesLost.Add(1)
	}
	return err
}

// slowFirstCall returns a receiver script whose first call of each key takes
// four leases of 300 ms, and a channel closed when that call starts.
func slowFirstCall() (func(webhooktest.Call) webhooktest.Response, <-chan struct{}) {
	started := make(chan struct{})
	var once sync.Once
	return func(c webhooktest.Call) webhooktest.Response {
		if c.N == 1 {
			once.Do(func() { close(started) })
			time.Sleep(1200 * time.Millisecond)
		}
		return webhooktest.Response{}
	}, started
}

// A handler slower than its lease keeps the key while the lease is
// refreshed: a copy of the message delivered to a second worker while the
// first one runs is not run, only retried until it finds the key done.
func TestLeaseSlowHandlerRefreshKeepsKey(t *testing.T) {
	respond, started := slowFirstCall()
	env := newLeaseEnv(t, memsource.Config{}, respond)
	other := randomName("topic")
	opts := consumer.LeaseOptions{Lease: 300 * time.Millisecond, RefreshInterval: 75 * time.Millisecond, InProgressDelay: 50 * time.Millisecond}
	s1, _ := newRedisStore(t)
	s2, _ := newRedisStore(t)
	spy1, spy2 := &leaseSpy{Lease: s1.Driver()}, &leaseSpy{Lease: s2.Driver()}
	r1 := env.runner(t, spy1, nil, opts, 1)
	r2 := env.runnerOn(t, other, spy2, nil, opts, 1)
	env.publish("slow", `{"to":"slow"}`, 1)
	go func() {
		<-started
		env.publishTo(other, "slow", `{"to":"slow"}`, 1) // the second worker's copy
	}()
	runtest.RunUntil(t, func() bool { return env.settled(other) && env.rcv.Successes(env.key("slow")) == 1 }, r1, r2)

	env.wantOncePerKey(t, []string{"slow"}, 1)
	if lost := spy1.completesLost.Load() + spy2.completesLost.Load(); lost != 0 {
		t.Fatalf("%d completions rejected, want none", lost)
	}
	if n := spy1.refreshes.Load(); n < 3 {
		t.Fatalf("%d refreshes during a handler of four leases, want several", n)
	}
	st1, st2 := r1.Stats(), r2.Stats()
	if st1.Handled != 1 || st2.Handled != 0 || st2.Retried == 0 || st2.Duplicates != 1 {
		t.Fatalf("stats %+v / %+v: want the first worker to handle the message and the second to find it in progress, then done", st1, st2)
	}
}

// With refreshing disabled, a handler slower than its lease loses the key: a
// second worker takes over (and calls the webhook again, with the same
// Idempotency-Key), and the first worker's "done" is rejected because its
// token is stale.
func TestLeaseSlowHandlerWithoutRefreshLosesKey(t *testing.T) {
	respond, started := slowFirstCall()
	env := newLeaseEnv(t, memsource.Config{}, respond)
	other := randomName("topic")
	opts := consumer.LeaseOptions{Lease: 300 * time.Millisecond, RefreshInterval: -1, InProgressDelay: 50 * time.Millisecond}
	s1, _ := newRedisStore(t)
	s2, _ := newRedisStore(t)
	spy1, spy2 := &leaseSpy{Lease: s1.Driver()}, &leaseSpy{Lease: s2.Driver()}
	r1 := env.runner(t, spy1, nil, opts, 1)
	r2 := env.runnerOn(t, other, spy2, nil, opts, 1)
	env.publish("slow", `{"to":"slow"}`, 1)
	go func() {
		<-started
		env.publishTo(other, "slow", `{"to":"slow"}`, 1)
	}()
	runtest.RunUntil(t, func() bool { return env.settled(other) && env.rcv.Calls(env.key("slow")) == 2 }, r1, r2)

	if got := env.rcv.Calls(env.key("slow")); got != 2 {
		t.Fatalf("%d webhook calls, want 2: the slow one and the takeover", got)
	}
	if lost := spy1.completesLost.Load(); lost != 1 {
		t.Fatalf("%d of the slow worker's completions rejected as stale, want exactly 1", lost)
	}
	if lost := spy2.completesLost.Load(); lost != 0 {
		t.Fatalf("%d of the second worker's completions rejected, want none", lost)
	}
	if refreshes := spy1.refreshes.Load() + spy2.refreshes.Load(); refreshes != 0 {
		t.Fatalf("%d refreshes with refreshing disabled", refreshes)
	}
	st1, st2 := r1.Stats(), r2.Stats()
	if st2.Handled != 1 || st1.Handled != 0 || st1.Duplicates != 1 || st1.DeadLettered+st2.DeadLettered != 0 {
		t.Fatalf("stats %+v / %+v: want the second worker to handle the message and the first one's retry to find it done", st1, st2)
	}
}

// If a refresh finds the lease lost, the handler's context is cancelled with
// dedup.ErrLeaseLost and nothing is marked done under the stale token.
func TestLeaseLostCancelsHandler(t *testing.T) {
	store, rdb := newRedisStore(t)
	env := newLeaseEnv(t, memsource.Config{}, nil)
	spy := &leaseSpy{Lease: store.Driver()}
	var causes []error
	var mu sync.Mutex
	stolen := make(chan struct{})
	h := func(ctx context.Context, msg *consumer.Message) error {
		key, _ := consumer.DedupKey(ctx)
		if msg.Attempt == 1 {
			// Another worker takes the key under our feet (as after an
			// expiry during a long pause).
			name := store.RedisKey(env.name, key)
			if err := rdb.HSet(ctx, name, "t", "someone-else").Err(); err != nil {
				return err
			}
			close(stolen)
			<-ctx.Done()
			mu.Lock()
			causes = append(causes, context.Cause(ctx))
			mu.Unlock()
			return ctx.Err()
		}
		return nil
	}
	opts := consumer.LeaseOptions{Lease: 5 * time.Second, RefreshInterval: 50 * time.Millisecond, InProgressDelay: 50 * time.Millisecond}
	r := env.runner(t, spy, h, opts, 1)
	env.publish("stolen", `{}`, 1)
	runtest.RunUntil(t, func() bool {
		select {
		case <-stolen:
		default:
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		return len(causes) == 1 && r.Stats().Retried >= 1
	}, r)

	if !errors.Is(causes[0], dedup.ErrLeaseLost) {
		t.Fatalf("handler context cancelled with %v, want dedup.ErrLeaseLost", causes[0])
	}
	if spy.completes.Load() != 0 {
		t.Fatalf("%d completions after the lease was lost, want none", spy.completes.Load())
	}
	e, err := store.Inspect(context.Background(), env.name, "stolen")
	if err != nil || !e.InProgress {
		t.Fatalf("key after the lost lease = %+v, %v; want still held by the other token", e, err)
	}
}

// A failing webhook releases the lease and is retried with backoff (with the
// same Idempotency-Key) until it succeeds; permanent errors and exhausted
// retries are dead-lettered; Retry-After sets the retry delay.
func TestLeaseWebhookOutcomes(t *testing.T) {
	store, _ := newRedisStore(t)
	var mu sync.Mutex
	retryDelays := map[string][]time.Duration{}
	onEvent := func(ev memsource.Event) {
		if ev.Kind == memsource.EventRetry {
			mu.Lock()
			retryDelays[ev.Key] = append(retryDelays[ev.Key], ev.Delay)
			mu.Unlock()
		}
	}
	env := newLeaseEnv(t, memsource.Config{OnEvent: onEvent}, func(c webhooktest.Call) webhooktest.Response {
		switch bare(c.Key) {
		case "flaky": // two outages, then success
			if c.N <= 2 {
				return webhooktest.Response{Status: http.StatusServiceUnavailable}
			}
		case "throttled": // asks for one second
			if c.N == 1 {
				return webhooktest.Response{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}}}
			}
		case "rejected":
			return webhooktest.Response{Status: http.StatusUnprocessableEntity, Body: "unknown recipient"}
		case "down":
			return webhooktest.Response{Status: http.StatusBadGateway}
		}
		return webhooktest.Response{}
	})
	r := env.runner(t, store, nil, consumer.LeaseOptions{}, 4)
	for _, k := range []string{"flaky", "throttled", "rejected", "down"} {
		env.publish(k, `{"to":"`+k+`"}`, 1)
	}
	runtest.RunUntil(t, func() bool { return env.settled() }, r)

	for k, want := range map[string][2]int{"flaky": {3, 1}, "throttled": {2, 1}, "rejected": {1, 0}, "down": {fastRetry.MaxAttempts, 0}} {
		if c, s := env.rcv.Calls(env.key(k)), env.rcv.Successes(env.key(k)); c != want[0] || s != want[1] {
			t.Errorf("key %s: %d calls, %d successes; want %d, %d", k, c, s, want[0], want[1])
		}
	}
	mu.Lock()
	if d := retryDelays["throttled"]; len(d) != 1 || d[0] != time.Second {
		t.Errorf("retry delays of the throttled message = %v, want [1s] from Retry-After", d)
	}
	mu.Unlock()
	dead := map[string]error{}
	for _, d := range env.broker.DeadLetters(env.topic) {
		dead[d.Key] = d.Err
	}
	var se *webhook.StatusError
	if err := dead["rejected"]; !errors.As(err, &se) || se.StatusCode != http.StatusUnprocessableEntity || errors.Is(err, consumer.ErrMaxAttempts) {
		t.Errorf("dead letter of the rejected message: %v, want the 422 at once", err)
	}
	if err := dead["down"]; !errors.Is(err, consumer.ErrMaxAttempts) || !errors.As(err, &se) {
		t.Errorf("dead letter of the message whose receiver is down: %v, want ErrMaxAttempts wrapping the 502", err)
	}
	if len(dead) != 2 {
		t.Errorf("dead letters %v, want rejected and down", dead)
	}
	// Failed attempts released their leases; done keys are done.
	for k, inProgress := range map[string]bool{"flaky": false, "throttled": false} {
		if e, err := store.Inspect(context.Background(), env.name, k); err != nil || e.InProgress != inProgress {
			t.Errorf("Inspect(%s) = %+v, %v", k, e, err)
		}
	}
	for _, k := range []string{"rejected", "down"} {
		if _, err := store.Inspect(context.Background(), env.name, k); !errors.Is(err, dedup.ErrNotFound) {
			t.Errorf("Inspect(%s) err = %v: a failed key must leave no record", k, err)
		}
	}
}

// The same key with another payload is dead-lettered as a mismatch, both
// while the first payload is in progress and after it is done, and never
// calls the webhook.
func TestLeasePayloadMismatch(t *testing.T) {
	store, _ := newRedisStore(t)
	env := newLeaseEnv(t, memsource.Config{}, nil)
	ctx := context.Background()
	first := []byte(`{"amount":1}`)
	// Another worker holds the key with the first payload.
	if _, err := store.Claim(ctx, env.name, dedup.Record{Key: "k", PayloadHash: dedup.HashPayload(first)}, "other", time.Minute); err != nil {
		t.Fatal(err)
	}
	r := env.runner(t, store, nil, consumer.LeaseOptions{}, 1)
	env.publish("k", `{"amount":2}`, 1)
	runtest.RunUntil(t, func() bool { return env.settled() }, r)
	if err := store.Complete(ctx, env.name, "k", "other", time.Hour); err != nil {
		t.Fatal(err)
	}
	env.publish("k", string(first), 1) // a duplicate of the done payload
	env.publish("k", `{"amount":3}`, 1)
	runtest.RunUntil(t, func() bool { return env.settled() }, r)

	if c := env.rcv.TotalCalls(); c != 0 {
		t.Fatalf("%d webhook calls, want none", c)
	}
	dl := env.broker.DeadLetters(env.topic)
	if len(dl) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dl))
	}
	for _, d := range dl {
		var mm *dedup.MismatchError
		if !errors.As(d.Err, &mm) || mm.Stored != dedup.HashPayload(first) {
			t.Fatalf("dead letter %s: %v, want a payload mismatch against the first payload", d.Body, d.Err)
		}
	}
	if st := r.Stats(); st.Mismatches != 2 || st.Duplicates != 1 || st.Handled != 0 {
		t.Fatalf("stats %+v: want 2 mismatches and 1 duplicate", st)
	}
}

// TestLeaseCrashWindow shows the duplicate window the lease path leaves: a
// worker that dies after the effect and before "mark done" leaves its lease
// in Redis; once the lease expires, the redelivery claims the key again and
// repeats the effect. The repeat carries the same Idempotency-Key, so a
// receiver that deduplicates by it applies the effect once.
//
// It also measures how large the window is: the time between the receiver's
// answer and the moment the key is durably done, over normal messages. A
// crash inside that interval causes a repeat; a crash anywhere else does not.
func TestLeaseCrashWindow(t *testing.T) {
	store, _ := newRedisStore(t)
	var mu sync.Mutex
	applied := map[string]int{} // effects a deduplicating receiver applies
	answered := map[string]time.Time{}
	var firstCall, repeatCall time.Time
	env := newLeaseEnv(t, memsource.Config{}, func(c webhooktest.Call) webhooktest.Response {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case bare(c.Key) == "crash" && c.N == 1:
			firstCall = time.Now()
		case bare(c.Key) == "crash" && c.N == 2:
			repeatCall = time.Now()
		}
		if c.N == 1 {
			applied[bare(c.Key)]++
		}
		answered[bare(c.Key)] = time.Now()
		return webhooktest.Response{}
	})

	const lease = 500 * time.Millisecond
	var windows []time.Duration
	crashedToken := ""
	spy := &leaseSpy{Lease: store.Driver()}
	spy.completeHook = func(ctx context.Context, scope, key, token string, retention time.Duration) error {
		mu.Lock()
		if key == "crash" && crashedToken == "" {
			crashedToken = token
		}
		crash := key == "crash" && token == crashedToken
		mu.Unlock()
		if crash {
			// The process dies here: the effect happened, and the key is
			// never marked done under this token (every retry of the mark
			// fails); the lease is not released and expires.
			return errors.New("worker crashed after the effect")
		}
		err := store.Complete(ctx, scope, key, token, retention)
		mu.Lock()
		if at, ok := answered[key]; ok && err == nil {
			windows = append(windows, time.Since(at))
		}
		mu.Unlock()
		return err
	}
	opts := consumer.LeaseOptions{Lease: lease, InProgressDelay: 50 * time.Millisecond}
	r := env.runner(t, spy, nil, opts, 4)
	env.publish("crash", `{"to":"crash"}`, 1)
	keys := keysN("normal", 200)
	for _, k := range keys {
		env.publish(k, `{"to":"`+k+`"}`, 1)
	}
	runtest.RunUntil(t, func() bool { return env.settled() }, r)

	if got := env.rcv.Calls(env.key("crash")); got != 2 {
		t.Fatalf("crashed message: %d webhook calls, want 2 (the effect, and its repeat after the lease expired)", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if applied["crash"] != 1 {
		t.Fatalf("a receiver deduplicating by Idempotency-Key applied the crashed message %d times, want 1", applied["crash"])
	}
	for _, k := range keys {
		if env.rcv.Calls(env.key(k)) != 1 {
			t.Fatalf("key %s: %d calls, want 1", k, env.rcv.Calls(env.key(k)))
		}
	}
	if st := r.Stats(); st.Handled != uint64(len(keys))+1 || st.DeadLettered != 0 {
		t.Fatalf("stats %+v: want every message handled", st)
	}
	slices.Sort(windows)
	pct := func(p float64) time.Duration { return windows[int(p*float64(len(windows)-1))] }
	t.Logf("crash window (receiver answered → key durably done), %d messages: p50 %v, p99 %v, max %v",
		len(windows), pct(0.5), pct(0.99), windows[len(windows)-1])
	t.Logf("after the crash the effect repeated %v later (lease %v): the repeat waits for the lease to expire",
		repeatCall.Sub(firstCall).Round(time.Millisecond), lease)
}

// TestLeaseRedisRestart restarts Redis while a stream of messages is being
// handled. The runner keeps working once Redis is back: store errors are
// retried, never dead-lettered, and every message is handled.
//
// What a restart without persistence means: Redis forgets every lease and
// every done record. Messages in flight at the moment of the restart may
// repeat their effect (at most one repeat per message being handled, so at
// most Concurrency of them), and redeliveries of messages done before the
// restart run again. Every repeat carries the same Idempotency-Key.
func TestLeaseRedisRestart(t *testing.T) {
	store, rdb := newRedisStore(t)
	env := newLeaseEnv(t, memsource.Config{}, nil)
	const concurrency, total = 4, 150
	opts := consumer.LeaseOptions{Lease: 2 * time.Second, InProgressDelay: 50 * time.Millisecond}
	r := env.runner(t, store, nil, opts, concurrency)
	keys := keysN("restart", total)

	persistent := redisPersists(t, rdb)
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	stop := func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	published := make(chan struct{})
	go func() {
		defer close(published)
		for _, k := range keys {
			env.publish(k, `{"to":"`+k+`"}`, 1)
			time.Sleep(3 * time.Millisecond)
		}
	}()
	waitFor(t, stop, func() bool { return r.Stats().Handled >= total/3 })
	testenv.Restart(t, testenv.Redis) // returns once Redis answers again
	<-published
	waitFor(t, stop, func() bool { return env.settled() })

	// Effects so far, before messages done before the restart are
	// delivered again.
	before := make(map[string]int, len(keys))
	repeats := 0
	for _, k := range keys {
		n := env.rcv.Successes(env.key(k))
		if n < 1 {
			t.Fatalf("key %s never reached the webhook", k)
		}
		before[k] = n
		repeats += n - 1
	}
	again := keys[:5]
	for _, k := range again {
		env.publish(k, `{"to":"`+k+`"}`, 1)
	}
	waitFor(t, stop, func() bool { return env.settled() })
	stop()

	st := r.Stats()
	if st.DeadLettered != 0 {
		t.Fatalf("%d messages dead-lettered across a Redis restart, want none", st.DeadLettered)
	}
	if repeats > concurrency {
		t.Fatalf("%d effects repeated across the restart, want at most %d (the messages being handled at that moment)", repeats, concurrency)
	}
	want := 1 // no persistence: the done record is gone, the redelivery runs again
	if persistent {
		want = 0
	}
	for _, k := range again {
		if got := env.rcv.Successes(env.key(k)) - before[k]; got != want {
			t.Fatalf("key %s, done before the restart, delivered again: %d more effects, want %d (Redis persistence: %v)", k, got, want, persistent)
		}
	}
	t.Logf("Redis restart (persistence %v): %d messages handled, %d effects repeated around the restart, %d retries",
		persistent, st.Handled, repeats, st.Retried)
}

// waitFor polls cond until it holds, or calls stop and fails t after
// leaseTestTimeout.
func waitFor(t *testing.T, stop func(), cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(leaseTestTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("condition not reached within %v", leaseTestTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// redisPersists reports whether the test Redis keeps data across a restart
// (AOF or RDB snapshots configured).
func redisPersists(t *testing.T, rdb *redis.Client) bool {
	t.Helper()
	ctx := context.Background()
	aof, err := rdb.ConfigGet(ctx, "appendonly").Result()
	if err != nil {
		t.Fatalf("CONFIG GET appendonly: %v", err)
	}
	save, err := rdb.ConfigGet(ctx, "save").Result()
	if err != nil {
		t.Fatalf("CONFIG GET save: %v", err)
	}
	return aof["appendonly"] == "yes" || save["save"] != ""
}

// A store that fails to mark a key done for a moment does not make the
// effect repeat: marking done is retried under the same token while the lease
// is kept alive.
func TestLeaseCompleteRetriedAfterStoreHiccup(t *testing.T) {
	store, _ := newRedisStore(t)
	env := newLeaseEnv(t, memsource.Config{}, nil)
	var failures atomic.Int64
	spy := &leaseSpy{Lease: store.Driver()}
	spy.completeHook = func(ctx context.Context, scope, key, token string, retention time.Duration) error {
		if key == "hiccup" && failures.Add(1) <= 3 {
			return errors.New("connection reset by peer")
		}
		return store.Complete(ctx, scope, key, token, retention)
	}
	r := env.runner(t, spy, nil, consumer.LeaseOptions{Lease: 2 * time.Second}, 1)
	env.publish("hiccup", `{"to":"hiccup"}`, 1)
	runtest.RunUntil(t, func() bool { return env.settled() }, r)

	env.wantOncePerKey(t, []string{"hiccup"}, 1)
	if st := r.Stats(); st.Handled != 1 || st.Retried != 0 {
		t.Fatalf("stats %+v: want the message handled once, without a retry", st)
	}
	if got := spy.completes.Load(); got != 4 {
		t.Fatalf("%d Complete calls, want 4 (three failures, then success)", got)
	}
}
