package kafkasource_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// testDB is a fresh schema with a migrated dedup store and an effects table:
// one row per handler run that committed.
type testDB struct {
	pool   *pgxpool.Pool
	store  *pgdedup.Store
	schema string
}

func newTestDB(t *testing.T) *testDB {
	t.Helper()
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := openDB(ctx, url, schema)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, db.pool)
	if err := db.store.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := db.pool.Exec(ctx, `CREATE TABLE `+db.table()+` (key text NOT NULL, body text NOT NULL)`); err != nil {
		t.Fatalf("create effects table: %v", err)
	}
	return db
}

func openDB(ctx context.Context, url, schema string) (*testDB, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 8 // the workers here run up to 4 lanes: one connection each, plus room
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &testDB{pool: pool, store: store, schema: schema}, nil
}

func (d *testDB) table() string { return pgx.Identifier{d.schema, "effects"}.Sanitize() }

// path returns the transactional path whose handler inserts one effect row
// and then calls after (if not nil) with the message.
func (d *testDB) path(after func(*consumer.Message) error) consumer.Path {
	insert := `INSERT INTO ` + d.table() + ` (key, body) VALUES ($1, $2)`
	return consumer.Transactional(d.store, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		key, _ := consumer.DedupKey(ctx)
		if _, err := tx.Exec(ctx, insert, key, string(msg.Body)); err != nil {
			return err
		}
		if after != nil {
			return after(msg)
		}
		return nil
	})
}

// counts returns the number of effect rows and of distinct keys among them.
func (d *testDB) counts(t testing.TB) (rows, keys int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := d.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT key) FROM `+d.table()).Scan(&rows, &keys)
	if err != nil {
		t.Fatalf("count effects: %v", err)
	}
	return rows, keys
}

// waitRows waits until at least n effect rows exist.
func (d *testDB) waitRows(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		rows, _ := d.counts(t)
		if rows >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d effect rows after %s", rows, n, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitKeys waits until the effects of n distinct keys exist, and fails t
// with the runner's counters after timeout.
func (d *testDB) waitKeys(t testing.TB, n int, timeout time.Duration, w *worker) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, keys := d.counts(t); keys == n {
			return
		}
		if time.Now().After(deadline) {
			_, keys := d.counts(t)
			t.Fatalf("%d of %d keys applied after %s; runner %+v", keys, n, timeout, w.runner.Stats())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitHandled waits until the runner has handled (committed) n messages.
func (w *worker) waitHandled(t testing.TB, n uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for w.runner.Stats().Handled < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d messages not handled after %s: %+v", n, timeout, w.runner.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// worker is a Runner over a Source, running in the background.
type worker struct {
	src    consumer.Source
	runner *consumer.Runner
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startWorker(t testing.TB, src consumer.Source, path consumer.Path, cfg consumer.Config) *worker {
	t.Helper()
	r, err := consumer.NewRunner(src, path, cfg)
	if err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &worker{src: src, runner: r, cancel: cancel, done: make(chan error, 1)}
	go func() { w.done <- r.Run(ctx) }()
	t.Cleanup(func() { w.stop(t) })
	return w
}

// stop stops the runner (draining it) and closes the source.
func (w *worker) stop(t testing.TB) {
	w.once.Do(func() {
		w.cancel()
		select {
		case err := <-w.done:
			if err != nil {
				t.Errorf("Runner.Run: %v", err)
			}
		case <-time.After(time.Minute):
			t.Errorf("Runner.Run did not return within a minute of its cancellation")
		}
		_ = w.src.Close()
	})
}

// highWatermarks returns the next offset of every partition of topic.
func highWatermarks(t testing.TB, brokers []string, topic string, partitions int) map[int]int64 {
	t.Helper()
	out := make(map[int]int64, partitions)
	for p := range partitions {
		out[p] = brokerenv.LastOffset(t, brokers, topic, p)
	}
	return out
}

// waitCommitted waits until the group committed every partition of topic up
// to its high watermark.
func waitCommitted(t testing.TB, brokers []string, group, topic string, partitions int, timeout time.Duration) {
	t.Helper()
	hw := highWatermarks(t, brokers, topic, partitions)
	deadline := time.Now().Add(timeout)
	for {
		committed := committedOffsets(t, brokers, group, topic, partitions)
		behind := 0
		for p, end := range hw {
			if end > 0 && committed[p] < end {
				behind++
			}
		}
		if behind == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s: committed %v, high watermarks %v after %s", group, committed, hw, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func keyed(prefix string, n int, partitionKeys int) []sourcetest.Outgoing {
	out := make([]sourcetest.Outgoing, n)
	for i := range out {
		key := fmt.Sprintf("%s-%05d", prefix, i)
		out[i] = sourcetest.Outgoing{Key: key, Body: []byte(`{"key":"` + key + `"}`)}
		if partitionKeys > 0 {
			out[i].PartitionKey = fmt.Sprintf("pk-%d", i%partitionKeys)
		}
	}
	return out
}

// ackCrash is a Source whose Ack commits the first limit messages and
// silently drops every later acknowledgement: the process "crashes" after
// the database commit and before the offset commit.
type ackCrash struct {
	*kafkasource.Source
	limit   int64
	acked   atomic.Int64
	dropped atomic.Int64
}

func (a *ackCrash) Ack(ctx context.Context, msgs []*consumer.Message) error {
	var keep []*consumer.Message
	for _, m := range msgs {
		if a.acked.Add(1) <= a.limit {
			keep = append(keep, m)
		} else {
			a.dropped.Add(1)
		}
	}
	if len(keep) == 0 {
		return nil
	}
	return a.Source.Ack(ctx, keep)
}

// TestCrashAfterCommitBeforeAck checks that messages whose
// effect committed but whose offset did not are redelivered to the next
// consumer and acknowledged without running the handler again.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel() // its own topic, group and schema
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	db := newTestDB(t)
	topic := newTopic(t, brokers, testPartitions)
	group := runtest.UniqueName(t, "g")
	const n = 400
	publish(t, brokers, topic, keyed("crash", n, 16)...)
	rc := consumer.Config{Name: group, BatchSize: 10, Concurrency: 4}

	// First life: every effect commits, only the first 100 offsets are
	// acknowledged, then the process "dies" (no further commits).
	crashing := &ackCrash{Source: openSource(t, testConfig(t, brokers, topic, group)), limit: 100}
	first := startWorker(t, crashing, db.path(nil), rc)
	db.waitRows(t, n, waitTimeout)
	first.stop(t)
	if crashing.dropped.Load() == 0 {
		t.Fatalf("no acknowledgement was dropped; the crash did not happen after a database commit")
	}

	// Second life: the redeliveries must not run the handler.
	var calls atomic.Int64
	second := startWorker(t, openSource(t, testConfig(t, brokers, topic, group)), db.path(func(*consumer.Message) error {
		calls.Add(1)
		return nil
	}), rc)
	waitCommitted(t, brokers, group, topic, testPartitions, waitTimeout)
	st := second.runner.Stats()
	second.stop(t)

	if c := calls.Load(); c != 0 {
		t.Errorf("the handler ran %d times for redelivered messages whose effect had committed", c)
	}
	if st.Duplicates < uint64(crashing.dropped.Load()) {
		t.Errorf("second consumer recognised %d duplicates, want at least the %d whose offsets were never committed",
			st.Duplicates, crashing.dropped.Load())
	}
	if rows, keys := db.counts(t); rows != n || keys != n {
		t.Fatalf("%d effect rows for %d keys, want exactly %d of each", rows, keys, n)
	}
}

// Environment of the helper worker process.
const (
	envHelper = "KAFKASOURCE_HELPER_WORKER"
	envTopic  = "KAFKASOURCE_HELPER_TOPIC"
	envGroup  = "KAFKASOURCE_HELPER_GROUP"
	envSchema = "KAFKASOURCE_HELPER_SCHEMA"
)

// TestHelperWorker is not a test: TestProcessKill runs the test
// binary with -test.run=^TestHelperWorker$ and envHelper=1 as a worker
// process, and kills it.
func TestHelperWorker(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("helper process for TestProcessKill")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	brokers := testenv.KafkaBrokers(t)
	db, err := openDB(ctx, testenv.DatabaseURL(t), os.Getenv(envSchema))
	if err != nil {
		t.Fatal(err)
	}
	defer db.pool.Close()
	group := os.Getenv(envGroup)
	src, err := kafkasource.New(ctx, testConfig(t, brokers, os.Getenv(envTopic), group))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	r, err := consumer.NewRunner(src, db.path(nil), consumer.Config{Name: group, BatchSize: 20, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	st := r.Stats()
	fmt.Printf("helper worker stopped: handled=%d duplicates=%d\n", st.Handled, st.Duplicates)
}

// TestProcessKill runs the consumer in a child process, kills it with
// SIGKILL at random points while it works, restarts it, and checks that every
// message's effect is applied exactly once.
func TestProcessKill(t *testing.T) {
	t.Parallel() // its own topic, group and schema
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	db := newTestDB(t)
	topic := newTopic(t, brokers, testPartitions)
	group := runtest.UniqueName(t, "g")
	const n = 3000
	publish(t, brokers, topic, keyed("kill", n, 64)...)

	var lives []*runtest.Child
	start := func() *runtest.Child {
		c := runtest.StartChild(t, "TestHelperWorker", []string{envHelper + "=1", envTopic + "=" + topic, envGroup + "=" + group, envSchema + "=" + db.schema})
		lives = append(lives, c)
		return c
	}
	defer func() {
		if t.Failed() {
			for _, c := range lives {
				t.Logf("worker process %d output:\n%s", c.Pid(), c.Output())
			}
		}
	}()

	// Two lives killed at random points of the stream, then a last one that
	// finishes it.
	killAt := []int{n/10 + rand.IntN(n/5), n/2 + rand.IntN(n/5)}
	for _, at := range killAt {
		w := start()
		db.waitRows(t, at, 2*waitTimeout)
		w.Kill()
		rows, _ := db.counts(t)
		t.Logf("killed worker pid %d at %d effect rows (aimed at %d)", w.Pid(), rows, at)
	}
	last := start()
	waitCommitted(t, brokers, group, topic, testPartitions, 2*waitTimeout)
	_ = syscall.Kill(last.Pid(), syscall.SIGTERM)
	select {
	case <-last.Done():
		if err := last.Err(); err != nil {
			t.Errorf("last worker process: %v", err)
		}
	case <-time.After(waitTimeout):
		last.Kill()
		t.Errorf("last worker process did not stop on SIGTERM")
	}
	if out := last.Output(); strings.Contains(out, "helper worker stopped") {
		t.Log(strings.SplitN(out[strings.LastIndex(out, "helper worker stopped"):], "\n", 2)[0])
	}

	if rows, keys := db.counts(t); rows != n || keys != n {
		t.Fatalf("%d effect rows for %d keys after two kills, want exactly %d of each", rows, keys, n)
	}
}

// TestRebalancesApplyEveryEffectOnce runs two consumers of one group while
// messages are produced; a third joins and one leaves mid-stream. Every
// message's effect must be applied exactly once.
func TestRebalancesApplyEveryEffectOnce(t *testing.T) {
	t.Parallel() // its own topic, group and schema
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	db := newTestDB(t)
	const partitions = 6
	topic := newTopic(t, brokers, partitions)
	group := runtest.UniqueName(t, "g")
	const n, chunk = 3000, 100
	msgs := keyed("reb", n, 200)

	// Produce in chunks over a few seconds so that the rebalances happen
	// while messages are in flight.
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for i := 0; i < n; i += chunk {
			publish(t, brokers, topic, msgs[i:i+chunk]...)
			time.Sleep(150 * time.Millisecond)
		}
	}()

	rc := consumer.Config{Name: group, BatchSize: 10, Concurrency: 4}
	slow := db.path(func(*consumer.Message) error { time.Sleep(time.Millisecond); return nil })
	newMember := func() (*worker, *kafkasource.Source) {
		src := openSource(t, testConfig(t, brokers, topic, group))
		return startWorker(t, src, slow, rc), src
	}
	a, _ := newMember()
	_, bSrc := newMember()

	db.waitRows(t, n/3, waitTimeout)
	_, cSrc := newMember()
	db.waitRows(t, 2*n/3, waitTimeout)
	a.stop(t)

	<-produced
	waitCommitted(t, brokers, group, topic, partitions, 2*waitTimeout)
	if g := bSrc.Stats().Rebalances; g < 2 {
		t.Errorf("the member that stayed joined %d generation(s); the test did not rebalance", g)
	}
	t.Logf("member stats: stayed %+v, joined %+v", bSrc.Stats(), cSrc.Stats())
	if rows, keys := db.counts(t); rows != n || keys != n {
		t.Fatalf("%d effect rows for %d keys across rebalances, want exactly %d of each", rows, keys, n)
	}
}

// TestProducerDuplicateAppliedOnce publishes the same event twice (two
// records, one key header): its effect is applied once. Without a key
// header the offset fallback cannot recognise it, as documented.
func TestProducerDuplicateAppliedOnce(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	db := newTestDB(t)
	topic := newTopic(t, brokers, testPartitions)
	group := runtest.UniqueName(t, "g")

	event := sourcetest.Outgoing{Key: "order-42", Body: []byte(`{"order":42,"amount":100}`), PartitionKey: "customer-1"}
	noKey := sourcetest.Outgoing{Body: []byte(`{"order":43}`), PartitionKey: "customer-2"}
	publish(t, brokers, topic, event, keyed("other", 10, 0)[0], noKey)
	publish(t, brokers, topic, event, noKey) // the producer sends both again

	var calls sync.Map
	w := startWorker(t, openSource(t, testConfig(t, brokers, topic, group)), db.path(func(m *consumer.Message) error {
		c, _ := calls.LoadOrStore(string(m.Body), new(atomic.Int64))
		c.(*atomic.Int64).Add(1)
		return nil
	}), consumer.Config{Name: group})
	waitCommitted(t, brokers, group, topic, testPartitions, waitTimeout)
	st := w.runner.Stats()
	w.stop(t)

	ctx := context.Background()
	var keyed, unkeyed int
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE key = 'order-42'), count(*) FILTER (WHERE body = $1) FROM `+db.table(),
		string(noKey.Body)).Scan(&keyed, &unkeyed); err != nil {
		t.Fatal(err)
	}
	if keyed != 1 || st.Duplicates != 1 {
		t.Errorf("event with a key header sent twice: %d effect rows, %d duplicates; want 1 and 1", keyed, st.Duplicates)
	}
	if c, _ := calls.Load(string(event.Body)); c.(*atomic.Int64).Load() != 1 {
		t.Errorf("handler ran %d times for the event sent twice", c.(*atomic.Int64).Load())
	}
	if unkeyed != 2 {
		t.Errorf("event without a key header sent twice: %d effect rows; the offset fallback is documented to apply it twice", unkeyed)
	}
}

// TestPoisonIsDeadLettered checks that failing messages are retried,
// then dead-lettered with the reason, while their partition continues.
func TestPoisonIsDeadLettered(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	db := newTestDB(t)
	topic := newTopic(t, brokers, 1) // one partition: poison sits in the middle of it
	group := runtest.UniqueName(t, "g")

	msgs := keyed("p", 10, 0)
	msgs[2].Body = []byte(`{"poison":"retry"}`)                                       // always fails: retried, then dead-lettered
	msgs[2].PartitionKey = "acct-1"                                                   //
	msgs[4].PartitionKey = "acct-1"                                                   // same key: waits for the poison, then applies
	msgs[6].Body = []byte(`{"poison":"permanent"}`)                                   // permanent failure: dead-lettered at once
	msgs[8] = sourcetest.Outgoing{Key: msgs[0].Key, Body: []byte(`{"changed":true}`)} // same key, other payload
	publish(t, brokers, topic, msgs...)

	var attempts atomic.Int64
	w := startWorker(t, openSource(t, testConfig(t, brokers, topic, group)), db.path(func(m *consumer.Message) error {
		switch string(m.Body) {
		case `{"poison":"retry"}`:
			attempts.Add(1)
			return errors.New("downstream rejects this message")
		case `{"poison":"permanent"}`:
			return consumer.Permanent(errors.New("unknown account"))
		}
		return nil
	}), consumer.Config{
		Name: group, BatchSize: 5, Concurrency: 2,
		Retry: consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond},
	})
	waitCommitted(t, brokers, group, topic, 1, waitTimeout)
	st := w.runner.Stats()
	w.stop(t)

	if rows, keys := db.counts(t); rows != 7 || keys != 7 {
		t.Errorf("%d effect rows for %d keys, want 7 (10 messages, 3 dead-lettered)", rows, keys)
	}
	if a := attempts.Load(); a != 3 {
		t.Errorf("the failing message was attempted %d times, want 3", a)
	}
	if st.DeadLettered != 3 || st.Mismatches != 1 {
		t.Errorf("runner stats %+v, want 3 dead-lettered, 1 mismatch", st)
	}

	dead := readTopic(t, brokers, kafkasource.DeadLetterTopic(topic))
	byOffset := map[string]kafka.Message{}
	for _, d := range dead {
		byOffset[header(d, kafkasource.MetaOriginOffset)] = d
	}
	if len(dead) != 3 {
		t.Fatalf("dead-letter topic holds %d messages, want 3", len(dead))
	}
	for offset, want := range map[string]struct{ reason, attempts string }{
		"2": {consumer.ErrMaxAttempts.Error(), "3"},
		"6": {"unknown account", "1"},
		"8": {"received payload", "1"},
	} {
		d, ok := byOffset[offset]
		if !ok {
			t.Errorf("no dead letter for offset %s", offset)
			continue
		}
		if r := header(d, consumer.MetaReason); !strings.Contains(r, want.reason) {
			t.Errorf("dead letter of offset %s: reason %q, want it to mention %q", offset, r, want.reason)
		}
		if a := header(d, consumer.MetaAttempts); a != want.attempts {
			t.Errorf("dead letter of offset %s: attempts %s, want %s", offset, a, want.attempts)
		}
		if header(d, kafkasource.MetaOriginTopic) != topic || header(d, kafkasource.MetaOriginPartition) != "0" {
			t.Errorf("dead letter of offset %s: origin %s/%s", offset,
				header(d, kafkasource.MetaOriginTopic), header(d, kafkasource.MetaOriginPartition))
		}
	}
}
