package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/consumertest"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/cfgerr"
)

// Invariants 1 and 2: the record and the effect commit together, and nothing
// is acknowledged before its commit; a failed commit acknowledges nothing.
func TestAckOnlyAfterCommit(t *testing.T) {
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			f := newFixture(t)
			store := newRecordingStore(f.store)
			store.failNext = 3 // the first three commits fail
			src := &checkingSource{Source: f.broker.Source(f.topic), t: t, store: store}
			ks := keys(40, "k")
			f.publish(ks...)
			r := f.start(src, consumer.Transactional[pgx.Tx](store, f.handler(nil)), consumer.Config{BatchSize: batch})
			st := f.settled()
			r.stop()
			f.requireOnce(ks...)
			if st.Acks != uint64(len(ks)) || st.DeadLettered != 0 {
				t.Fatalf("broker stats %+v: want %d acks, no dead letters", st, len(ks))
			}
			if got := r.Stats().CommitFailures; got != 3 {
				t.Fatalf("CommitFailures = %d, want 3", got)
			}
		})
	}
}

// A commit that PostgreSQL itself refuses (a deferred constraint) leaves no
// record and no ack; once the cause is fixed the message applies once.
func TestDeferredConstraintFailsCommit(t *testing.T) {
	f := newFixture(t)
	allowed := strings.Replace(f.table, `"effects"`, `"allowed"`, 1)
	f.exec(`CREATE TABLE ` + allowed + ` (key text PRIMARY KEY)`)
	f.exec(`ALTER TABLE ` + f.table + ` ADD FOREIGN KEY (key) REFERENCES ` + allowed + ` DEFERRABLE INITIALLY DEFERRED`)
	f.exec(`INSERT INTO ` + allowed + ` VALUES ('a'), ('b')`)
	f.publish("a", "b", "c")
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(nil)),
		consumer.Config{Concurrency: 1, Retry: consumer.RetryPolicy{MaxAttempts: 1000, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}})
	f.waitFor("c to be retried", func(memsource.TopicStats) bool { return f.calls("c") >= 2 })
	if _, err := f.store.Inspect(context.Background(), "test", "c"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("record of c after failed commits: %v, want ErrNotFound", err)
	}
	f.exec(`INSERT INTO ` + allowed + ` VALUES ('c')`)
	f.settled()
	r.stop()
	f.requireOnce("a", "b", "c")
	if r.Stats().CommitFailures == 0 {
		t.Fatal("no commit failure counted")
	}
}

// Invariant 3: redeliveries, concurrent duplicates, producer duplicates and
// crashes after the commit never run the handler twice, with two workers
// competing for the messages.
func TestDuplicatesNeverRunTwice(t *testing.T) {
	f := newFixture(t)
	ks := keys(60, "d")
	faults := []consumertest.FaultKind{consumertest.None, consumertest.Redelivered, consumertest.ConcurrentDuplicate,
		consumertest.CrashAfterCommit, consumertest.ProducerDuplicate}
	script := make([]consumertest.Delivery, len(ks))
	for i, k := range ks {
		script[i] = consumertest.Delivery{Key: k, Body: []byte("body-" + k), Fault: faults[i%len(faults)]}
	}
	rep := consumertest.ReplayTx(t, f.store, f.handler(nil), script, consumertest.Options{BatchSize: 8})
	rep.RequireExactlyOnce(t)
	f.requireOnce(ks...)
	for _, k := range ks {
		if n := f.calls(k); n != 1 {
			t.Errorf("handler ran %d times for %s, want 1", n, k)
		}
	}
	if rep.Duplicates == 0 {
		t.Fatalf("the faults did not fire: %d deliveries, no duplicate absorbed", rep.Deliveries)
	}
	t.Logf("deliveries %d, duplicates absorbed %d", rep.Deliveries, rep.Duplicates)
}

// Invariant 4: a failed handler leaves no record; its retry runs it again.
// Failures and panics are retried with backoff, then dead-lettered.
func TestFailedHandlerLeavesNoRecord(t *testing.T) {
	f := newFixture(t)
	f.publish("flaky", "panics", "always")
	var sawNoRecord atomic.Bool
	fail := func(msg *consumer.Message, call int) error {
		switch {
		case msg.Key == "flaky" && call < 3:
			return errors.New("transient")
		case msg.Key == "flaky":
			// Third call: the two failed attempts left no record.
			sawNoRecord.Store(true)
		case msg.Key == "panics" && call == 1:
			panic("boom")
		case msg.Key == "always":
			return errors.New("never works")
		}
		return nil
	}
	f.maxCalls("flaky", 3)
	f.maxCalls("panics", 2)
	f.maxCalls("always", 4)
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(fail)),
		consumer.Config{Retry: consumer.RetryPolicy{MaxAttempts: 4, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}})
	f.settled()
	r.stop()
	f.requireOnce("flaky", "panics")
	if f.calls("flaky") != 3 || f.calls("panics") != 2 || f.calls("always") != 4 {
		t.Fatalf("calls: flaky %d (want 3), panics %d (want 2), always %d (want 4)", f.calls("flaky"), f.calls("panics"), f.calls("always"))
	}
	if _, err := f.store.Inspect(context.Background(), "test", "always"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("record of the dead-lettered key: %v, want ErrNotFound", err)
	}
	dl := f.broker.DeadLetters(f.topic)
	if len(dl) != 1 || dl[0].Key != "always" || !errors.Is(dl[0].Err, consumer.ErrMaxAttempts) || dl[0].Attempts != 4 {
		t.Fatalf("dead letters = %+v, want key always after 4 attempts with ErrMaxAttempts", dl)
	}
}

// One failing handler in a batch does not undo the others: the batch runs
// again without it (messages before it run twice, committed once).
func TestBatchSavepointIsolatesFailure(t *testing.T) {
	f := newFixture(t)
	ks := keys(10, "b")
	f.publish(ks...)
	fail := func(msg *consumer.Message, call int) error {
		if msg.Key == "b004" && call == 1 {
			return errors.New("fails once")
		}
		return nil
	}
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(fail)),
		consumer.Config{Concurrency: 1, BatchSize: 10})
	f.settled()
	r.stop()
	f.requireOnce(ks...)
	for _, k := range ks {
		if k == "b004" && f.calls(k) != 2 || f.calls(k) > 2 {
			t.Errorf("%s ran %d times, want 2 for b004 and at most 2 for the others (one rerun without the culprit)", k, f.calls(k))
		}
	}
}

// Invariant 5: the same key with a different payload is poison, not a
// duplicate: dead-lettered with both hashes, never applied.
func TestPayloadMismatchIsDeadLettered(t *testing.T) {
	f := newFixture(t)
	f.broker.Publish(f.topic, memsource.Outgoing{Key: "order-1", Body: []byte(`{"amount":10}`)})
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(nil)), consumer.Config{})
	f.settled()
	f.broker.Publish(f.topic, memsource.Outgoing{Key: "order-1", Body: []byte(`{"amount":99}`)})
	f.settled()
	r.stop()
	f.requireOnce("order-1")
	dl := f.broker.DeadLetters(f.topic)
	var mm *dedup.MismatchError
	if len(dl) != 1 || !errors.As(dl[0].Err, &mm) || !errors.Is(dl[0].Err, consumer.ErrPayloadMismatch) {
		t.Fatalf("dead letters = %+v, want one *MismatchError", dl)
	}
	if mm.Stored != dedup.HashPayload([]byte(`{"amount":10}`)) || mm.Received != dedup.HashPayload([]byte(`{"amount":99}`)) {
		t.Fatalf("mismatch hashes %s / %s do not match the payloads", mm.Stored.Short(), mm.Received.Short())
	}
	if st := r.Stats(); st.Mismatches != 1 || f.calls("order-1") != 1 {
		t.Fatalf("mismatches %d, calls %d; want 1, 1", st.Mismatches, f.calls("order-1"))
	}
}

// Invariant 7: bad input goes to the dead-letter route at once, without
// retries and without running the handler.
func TestBadInputIsDeadLetteredOnce(t *testing.T) {
	f := newFixture(t)
	type order struct {
		Amount int `json:"amount"`
	}
	f.broker.Publish(f.topic,
		memsource.Outgoing{Key: "", Body: []byte(`{"amount":1}`)},                // no key
		memsource.Outgoing{Key: "garbled", Body: []byte(`{"amount":`)},           // malformed
		memsource.Outgoing{Key: "huge", Body: []byte(strings.Repeat("x", 2048))}, // oversized
		memsource.Outgoing{Key: "good", Body: []byte(`{"amount":5}`)},
	)
	h := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message, o order) error {
		return f.handler(nil)(ctx, tx, msg)
	})
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, h), consumer.Config{
		MaxMessageBytes: 1024,
		// Without a key the default would fall back to the broker's id.
		KeyFunc: func(m *consumer.Message) (string, error) { return m.Key, nil },
	})
	st := f.settled()
	r.stop()
	f.requireOnce("good")
	// A delivery left in flight past the fixture's visibility timeout (a
	// loaded machine) comes back without being a retry: not counted.
	if st.Deliveries-st.Expired != 4 {
		t.Fatalf("%d deliveries (%d after an expired visibility timeout), want 4: bad input must not be retried", st.Deliveries, st.Expired)
	}
	want := map[string]error{"": consumer.ErrMissingKey, "garbled": consumer.ErrMalformed, "huge": consumer.ErrOversized}
	dl := f.broker.DeadLetters(f.topic)
	if len(dl) != len(want) {
		t.Fatalf("%d dead letters, want %d: %+v", len(dl), len(want), dl)
	}
	for _, d := range dl {
		var reason *consumer.DeadLetterError
		if !errors.Is(d.Err, want[d.Key]) || !errors.As(d.Err, &reason) {
			t.Errorf("dead letter %q: %v, want %v inside a *DeadLetterError", d.Key, d.Err, want[d.Key])
		}
	}
}

// Permanent and RetryAfter let a handler choose the route.
func TestPermanentAndRetryAfter(t *testing.T) {
	f := newFixture(t)
	f.publish("perm", "later")
	fail := func(msg *consumer.Message, call int) error {
		switch {
		case msg.Key == "perm":
			return consumer.Permanent(errors.New("unknown account"))
		case msg.Key == "later" && call == 1:
			return consumer.RetryAfter(50*time.Millisecond, errors.New("rate limited"))
		}
		return nil
	}
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(fail)), consumer.Config{})
	f.settled()
	r.stop()
	f.requireOnce("later")
	if f.calls("perm") != 1 || f.calls("later") != 2 {
		t.Fatalf("calls perm %d (want 1), later %d (want 2)", f.calls("perm"), f.calls("later"))
	}
}

// Failed acks after commit are harmless: the redelivery is acknowledged
// without running the handler, and the failures are counted.
func TestAckFailureAfterCommit(t *testing.T) {
	f := newFixture(t)
	ks := keys(20, "a")
	f.broker.Inject(memsource.Fault{Kind: memsource.AckError, Times: 5})
	f.publish(ks...)
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(nil)), consumer.Config{})
	f.settled()
	r.stop()
	f.requireOnce(ks...)
	st := r.Stats()
	if st.AckFailures == 0 || st.Duplicates == 0 {
		t.Fatalf("stats %+v: want ack failures and their redeliveries acknowledged as duplicates", st)
	}
	for _, k := range ks {
		if f.calls(k) != 1 {
			t.Errorf("%s ran %d times", k, f.calls(k))
		}
	}
}

// An unreachable broker is retried with backoff, not in a hot loop, and
// nothing is lost.
func TestUnreachableBrokerIsRetried(t *testing.T) {
	f := newFixture(t)
	f.publish(keys(5, "u")...)
	f.broker.Inject(memsource.Fault{Kind: memsource.ReceiveError, Times: 4})
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(nil)), consumer.Config{})
	f.settled()
	r.stop()
	f.requireOnce(keys(5, "u")...)
	if got := r.Stats().ReceiveFailures; got != 4 {
		t.Fatalf("ReceiveFailures = %d, want 4", got)
	}
}

// Invariant 6: stopping drains in-flight work (commit, ack) and returns; what
// was not started goes back to the broker.
func TestStopDrainsInFlight(t *testing.T) {
	f := newFixture(t)
	// The in-flight deliveries must still be valid when their acks go out.
	f.visibility(10 * time.Second)
	ks := keys(6, "s")
	f.publish(ks...)
	started := make(chan struct{}, len(ks))
	release := make(chan struct{})
	slow := func(msg *consumer.Message, call int) error {
		started <- struct{}{}
		<-release
		return nil
	}
	src := f.broker.Source(f.topic)
	r := f.start(src, consumer.Transactional(f.store, f.handler(slow)), consumer.Config{Concurrency: 2})
	<-started
	<-started
	go func() { time.Sleep(100 * time.Millisecond); close(release) }()
	r.stop() // returns only after the in-flight handlers committed and acked
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	got := f.effects()
	st := f.broker.Stats(f.topic)
	if int(st.Acks) != len(got) || len(got) < 2 {
		t.Fatalf("after stop: %d effects, %d acks; want every committed effect acknowledged (at least the 2 in flight)", len(got), st.Acks)
	}
	// The rest is still with the broker and applied by the next worker.
	r2 := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(nil)), consumer.Config{})
	f.settled()
	r2.stop()
	f.requireOnce(ks...)
}

// Messages with one partition key are handled one after another, in order.
func TestPartitionKeyOrder(t *testing.T) {
	f := newFixture(t)
	for i := range 30 {
		f.broker.Publish(f.topic, memsource.Outgoing{
			Key: fmt.Sprintf("o%02d", i), Body: []byte(fmt.Sprint(i)), PartitionKey: fmt.Sprint("acct-", i%3),
		})
	}
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(nil)), consumer.Config{Concurrency: 3, BatchSize: 4})
	f.settled()
	r.stop()
	rows, err := f.pool.Query(context.Background(), `SELECT body FROM `+f.table+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	bodies, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	last := map[int]int{0: -1, 1: -1, 2: -1}
	for _, b := range bodies {
		var i int
		if err := json.Unmarshal([]byte(b), &i); err != nil {
			t.Fatal(err)
		}
		if i <= last[i%3] {
			t.Fatalf("partition %d: %d applied after %d", i%3, i, last[i%3])
		}
		last[i%3] = i
	}
}

// TestConfigErrorsNameEveryField: a Config with several bad fields reports
// each of them, every one a *idemq.ConfigError matching idemq.ErrInvalidConfig.
func TestConfigErrorsNameEveryField(t *testing.T) {
	src := memsource.New(memsource.Config{}).Source("t")
	ms := memStore(t)
	noop := func(context.Context, *consumer.Message) error { return nil }
	cases := []struct {
		name string
		cfg  consumer.Config
		path consumer.Path
		want []string
	}{
		{"two fields", consumer.Config{Concurrency: -1}, consumer.Leased(ms.Leases(), noop, consumer.LeaseOptions{}),
			[]string{"Name", "Concurrency"}},
		{"config, retry and path", consumer.Config{Name: "x", BatchSize: -1, Retry: consumer.RetryPolicy{Jitter: 2}},
			consumer.Leased(nil, nil, consumer.LeaseOptions{}),
			[]string{"BatchSize", "Retry.Jitter", "Leased store", "Leased handler"}},
	}
	for _, tc := range cases {
		_, err := consumer.NewRunner(src, tc.path, tc.cfg)
		if !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("%s: NewRunner = %v, want idemq.ErrInvalidConfig", tc.name, err)
		}
		if got := cfgerr.Fields(err); !slices.Equal(got, tc.want) {
			t.Errorf("%s: NewRunner = %v, reports fields %q, want %q", tc.name, err, got, tc.want)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	src := memsource.New(memsource.Config{}).Source("t")
	ms := memStore(t)
	noop := func(context.Context, *consumer.Message) error { return nil }
	path := consumer.Leased(ms.Leases(), noop, consumer.LeaseOptions{})
	cases := []consumer.Config{
		{},
		{Name: "x", Concurrency: -1},
		{Name: "x", BatchSize: -5},
		{Name: "x", Retry: consumer.RetryPolicy{MaxAttempts: -1}},
		{Name: "x", Retry: consumer.RetryPolicy{InitialBackoff: time.Minute, MaxBackoff: time.Second}},
		{Name: "x", Retry: consumer.RetryPolicy{Jitter: 1.5}},
	}
	for _, cfg := range cases {
		var ce *idemq.ConfigError
		if _, err := consumer.NewRunner(src, path, cfg); !errors.Is(err, idemq.ErrInvalidConfig) || !errors.As(err, &ce) {
			t.Errorf("NewRunner(%+v) = %v, want a *idemq.ConfigError", cfg, err)
		}
	}
	if _, err := consumer.NewRunner(nil, path, consumer.Config{Name: "x"}); !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Errorf("nil source: %v", err)
	}
	badPaths := map[string]consumer.Path{
		"nil lease store":         consumer.Leased(nil, noop, consumer.LeaseOptions{}),
		"nil lease handler":       consumer.Leased(ms.Leases(), nil, consumer.LeaseOptions{}),
		"negative lease":          consumer.Leased(ms.Leases(), noop, consumer.LeaseOptions{Lease: -time.Second}),
		"refresh at half a lease": consumer.Leased(ms.Leases(), noop, consumer.LeaseOptions{Lease: time.Second, RefreshInterval: 500 * time.Millisecond}),
		"nil tx store":            consumer.Transactional[*memdedup.Tx](nil, func(context.Context, *memdedup.Tx, *consumer.Message) error { return nil }),
		"nil tx handler":          consumer.Transactional[*memdedup.Tx](ms, nil),
	}
	for name, p := range badPaths {
		if _, err := consumer.NewRunner(src, p, consumer.Config{Name: "x"}); !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("%s: NewRunner = %v, want idemq.ErrInvalidConfig", name, err)
		}
	}
	r := newRunner(t, src, path, consumer.Config{Name: "x"})
	if c := r.Config(); c.Concurrency != 4 || c.Retry.MaxAttempts != 5 || c.Logger == nil {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

func TestBackoffGrowsAndCaps(t *testing.T) {
	p := consumer.RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, Jitter: -1}.WithDefaults()
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := p.Backoff(i + 1); got != w*time.Millisecond {
			t.Errorf("Backoff(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
}

// Deadlocks and serialization failures say nothing about the message: they
// are retried without counting against MaxAttempts.
func TestTransientDatabaseErrorsAreNotDeadLettered(t *testing.T) {
	f := newFixture(t)
	f.publish("busy")
	fail := func(msg *consumer.Message, call int) error {
		if call <= 4 {
			return fmt.Errorf("update account: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
		}
		return nil
	}
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(fail)),
		consumer.Config{Retry: consumer.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}})
	f.settled()
	r.stop()
	f.requireOnce("busy")
	if dl := f.broker.DeadLetters(f.topic); len(dl) != 0 {
		t.Fatalf("dead-lettered after transient errors: %+v", dl)
	}
}

// A failed message holds the later messages of its partition in the same
// batch, so they do not overtake it.
func TestPartitionOrderKeptAfterFailure(t *testing.T) {
	f := newFixture(t)
	for i := range 6 {
		f.broker.Publish(f.topic, memsource.Outgoing{Key: fmt.Sprintf("p%d", i), Body: []byte(fmt.Sprint(i)), PartitionKey: "acct-1"})
	}
	fail := func(msg *consumer.Message, call int) error {
		if msg.Key == "p2" && call == 1 {
			return errors.New("fails once")
		}
		return nil
	}
	// BatchWait makes the six one batch: a lane starts with what is queued,
	// which under the race detector is sometimes fewer, and the hold covers
	// the failed message's batch (see Transactional).
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(fail)),
		consumer.Config{Concurrency: 1, BatchSize: 6, BatchWait: 500 * time.Millisecond})
	f.settled()
	r.stop()
	f.requireOnce("p0", "p1", "p2", "p3", "p4", "p5")
	rows, err := f.pool.Query(context.Background(), `SELECT body FROM `+f.table+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	bodies, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(bodies, ","); got != "0,1,2,3,4,5" {
		t.Fatalf("applied in order %s, want 0,1,2,3,4,5", got)
	}
	for _, k := range []string{"p3", "p4", "p5"} {
		if f.calls(k) != 1 {
			t.Errorf("%s ran %d times: held messages must not run before the failed one", k, f.calls(k))
		}
	}
}

// releasingSource records which of Retry and Release the runner used.
type releasingSource struct {
	consumer.Source
	retries, releases atomic.Int64
}

func (s *releasingSource) Retry(ctx context.Context, m *consumer.Message, d time.Duration) error {
	s.retries.Add(1)
	return s.Source.Retry(ctx, m, d)
}

func (s *releasingSource) Release(ctx context.Context, m *consumer.Message, d time.Duration, _ error) error {
	s.releases.Add(1)
	return s.Source.Retry(ctx, m, d)
}

// Sources that can hand a message back without counting an attempt are asked
// to when the message is not at fault, and only then.
func TestReleaserForFailuresThatAreNotTheMessages(t *testing.T) {
	f := newFixture(t)
	f.publish("busy", "flaky")
	fail := func(msg *consumer.Message, call int) error {
		switch {
		case msg.Key == "busy" && call <= 3:
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
		case msg.Key == "flaky" && call <= 2:
			return errors.New("handler bug")
		}
		return nil
	}
	src := &releasingSource{Source: f.broker.Source(f.topic)}
	r := f.start(src, consumer.Transactional(f.store, f.handler(fail)), consumer.Config{})
	f.settled()
	r.stop()
	f.requireOnce("busy", "flaky")
	if src.releases.Load() != 3 || src.retries.Load() != 2 {
		t.Fatalf("releases %d (want 3, the serialization failures), retries %d (want 2, the handler errors)",
			src.releases.Load(), src.retries.Load())
	}
}

// WaitIdle returns once everything received is settled and nothing new came.
func TestWaitIdle(t *testing.T) {
	f := newFixture(t)
	ks := keys(25, "w")
	f.publish(ks...)
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(nil)), consumer.Config{BatchSize: 5})
	if err := r.WaitIdle(testCtx(t), 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Handled != uint64(len(ks)) {
		t.Fatalf("WaitIdle returned with %d of %d handled", st.Handled, len(ks))
	}
	r.stop()
	f.requireOnce(ks...)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.WaitIdle(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitIdle with a cancelled context = %v", err)
	}
}

// A message whose first statement fails (here: does not even parse) must not
// undo the committed work of an earlier message of its batch.
func TestFailingFirstStatementKeepsBatchMates(t *testing.T) {
	for _, broken := range []string{
		`SELEC 1`,                    // fails to prepare, with arguments below
		`SELECT 1; SELECT nosuchcol`, // several statements, no arguments
	} {
		t.Run(broken, func(t *testing.T) {
			f := newFixture(t)
			f.publish("a", "b", "c")
			fail := f.handler(nil)
			h := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
				if msg.Key == "b" && f.calls("b") == 0 {
					f.mu.Lock()
					f.runs["b"]++
					f.mu.Unlock()
					var err error
					if strings.Contains(broken, ";") {
						_, err = tx.Exec(ctx, broken)
					} else {
						_, err = tx.Exec(ctx, broken, 1)
					}
					return err
				}
				return fail(ctx, tx, msg)
			}
			r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, h), consumer.Config{Concurrency: 1, BatchSize: 3})
			f.settled()
			r.stop()
			f.requireOnce("a", "b", "c")
		})
	}
}

// Keys that no store can hold are dead-lettered at once instead of failing
// their batch's claim again and again.
func TestInvalidKeysAreDeadLettered(t *testing.T) {
	f := newFixture(t)
	bad := []string{"nul\x00byte", "bad-utf8-\xff", strings.Repeat("k", consumer.MaxKeyBytes+1)}
	for _, k := range append(bad, "good") {
		f.broker.Publish(f.topic, memsource.Outgoing{Key: k, Body: []byte("x")})
	}
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(nil)), consumer.Config{BatchSize: 4, Concurrency: 1})
	st := f.settled()
	r.stop()
	f.requireOnce("good")
	// Redeliveries after an expired visibility timeout are not retries.
	if st.Deliveries-st.Expired != 4 {
		t.Fatalf("%d deliveries (%d after an expired visibility timeout), want 4 (no retries)", st.Deliveries, st.Expired)
	}
	dl := f.broker.DeadLetters(f.topic)
	if len(dl) != len(bad) {
		t.Fatalf("%d dead letters, want %d", len(dl), len(bad))
	}
	for _, d := range dl {
		if !errors.Is(d.Err, consumer.ErrInvalidKey) {
			t.Errorf("dead letter %q: %v, want ErrInvalidKey", d.Key, d.Err)
		}
	}
}

// A handler that swallows a database error leaves its transaction aborted, so
// the batch's commit fails. The runner finds the culprit (pgdedup reports the
// failed transaction as soon as the handler returns): the others commit, and
// only the culprit is retried and, in the end, dead-lettered.
func TestPoisonedBatchIsSplit(t *testing.T) {
	f := newFixture(t)
	ks := keys(6, "s")
	f.publish(append(ks, "poison")...)
	h := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		if msg.Key == "poison" {
			_, _ = tx.Exec(ctx, `SELECT 1/$1::int`, 0) // error ignored: the transaction is now aborted
			return nil
		}
		return f.handler(nil)(ctx, tx, msg)
	}
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, h),
		consumer.Config{Concurrency: 1, BatchSize: 7, Retry: consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}})
	f.settled()
	r.stop()
	f.requireOnce(ks...)
	dl := f.broker.DeadLetters(f.topic)
	if len(dl) != 1 || dl[0].Key != "poison" || !errors.Is(dl[0].Err, consumer.ErrMaxAttempts) {
		t.Fatalf("dead letters = %+v, want only poison, after its attempts", dl)
	}
	for _, k := range ks {
		if f.calls(k) > 2 {
			t.Errorf("%s ran %d times, want at most 2 (the failed batch and its own transaction)", k, f.calls(k))
		}
	}
}

// A RetryPolicy with NaN, infinite or overflowing values is refused, and
// Backoff saturates whatever it is given: never negative, never above
// MaxBackoff, so that no retry loops without a pause.
func TestRetryPolicyRefusesNaNAndSaturates(t *testing.T) {
	src := memsource.New(memsource.Config{}).Source("t")
	ms := memStore(t)
	path := consumer.Leased(ms.Leases(), func(context.Context, *consumer.Message) error { return nil }, consumer.LeaseOptions{})
	bad := map[string]consumer.RetryPolicy{
		"NaN multiplier":   {Multiplier: math.NaN()},
		"Inf multiplier":   {Multiplier: math.Inf(1)},
		"NaN jitter":       {Jitter: math.NaN()},
		"-Inf jitter":      {Jitter: math.Inf(-1)},
		"negative initial": {InitialBackoff: -time.Second},
	}
	for name, p := range bad {
		var ce *idemq.ConfigError
		if _, err := consumer.NewRunner(src, path, consumer.Config{Name: "x", Retry: p}); !errors.As(err, &ce) {
			t.Errorf("%s: NewRunner = %v, want a *idemq.ConfigError", name, err)
		}
	}

	huge := time.Duration(math.MaxInt64)
	policies := []consumer.RetryPolicy{
		{Multiplier: math.NaN()},
		{Multiplier: math.Inf(1)},
		{Multiplier: 2, Jitter: math.NaN()},
		{InitialBackoff: huge, MaxBackoff: huge, Multiplier: 2, Jitter: 0.5},
		{InitialBackoff: huge - 1, MaxBackoff: huge, Multiplier: 1, Jitter: 0.99},
		{InitialBackoff: time.Second, MaxBackoff: huge, Multiplier: 1e300, Jitter: 0.2},
		{InitialBackoff: time.Second, MaxBackoff: 2 * time.Second, Multiplier: 2, Jitter: 0.9},
		{InitialBackoff: -time.Second, MaxBackoff: -time.Second},
	}
	for _, p := range policies {
		p = p.WithDefaults()
		for _, attempt := range []int{math.MinInt, 0, 1, 2, 3, 64, 1 << 20, math.MaxInt} {
			for range 20 { // jitter is random
				d := p.Backoff(attempt)
				if d < 0 || d > max(p.MaxBackoff, 0) {
					t.Fatalf("%+v.Backoff(%d) = %v, want within [0, %v]", p, attempt, d, max(p.MaxBackoff, 0))
				}
			}
		}
	}
}

// FuzzBackoff: whatever the policy, Backoff stays within [0, MaxBackoff].
func FuzzBackoff(f *testing.F) {
	f.Add(int64(200*time.Millisecond), int64(30*time.Second), 2.0, 0.2, 3)
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), 2.0, 0.5, 1)
	f.Add(int64(1), int64(math.MaxInt64), math.NaN(), math.NaN(), 7)
	f.Fuzz(func(t *testing.T, initial, maxB int64, mult, jitter float64, attempt int) {
		p := consumer.RetryPolicy{InitialBackoff: time.Duration(initial), MaxBackoff: time.Duration(maxB), Multiplier: mult, Jitter: jitter}
		d := p.Backoff(attempt)
		if d < 0 || d > max(p.MaxBackoff, 0) {
			t.Fatalf("%+v.Backoff(%d) = %v, want within [0, %v]", p, attempt, d, max(p.MaxBackoff, 0))
		}
	})
}

// A MessageError without a message still prints, and a batch handler that
// returns one blames no message by it.
func TestMessageErrorWithoutMessage(t *testing.T) {
	var got string
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Fatalf("MessageError{}.Error() panicked: %v", v)
			}
		}()
		got = (&consumer.MessageError{Err: errors.New("boom")}).Error()
	}()
	if !strings.Contains(got, "boom") {
		t.Errorf("MessageError{Err: boom}.Error() = %q, want it to name boom", got)
	}
	_ = (&consumer.MessageError{}).Error()
}
