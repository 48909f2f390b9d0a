package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// fixture is a real PostgreSQL schema with an effects table, a pgdedup store
// and an in-memory broker.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	store  *pgdedup.Store
	broker *memsource.Broker
	topic  string
	table  string

	mu     sync.Mutex
	runs   map[string]int // handler calls per key
	budget map[string]int // most handler calls allowed per key (see maxCalls)
}

// maxCalls makes waitFor fail as soon as the handler has run more than n
// times for key: a test that expects n calls reports the extra one when it
// happens instead of waiting for the messages to settle.
func (f *fixture) maxCalls(key string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.budget == nil {
		f.budget = map[string]int{}
	}
	f.budget[key] = n
}

// overBudget describes a key whose handler ran more often than maxCalls
// allows, or returns "".
func (f *fixture) overBudget() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, n := range f.budget {
		if f.runs[k] > n {
			return fmt.Sprintf("handler ran %d times for %s, want at most %d", f.runs[k], k, n)
		}
	}
	return ""
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool, schema := testenv.SchemaPool(t)
	ctx := testCtx(t)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	f := &fixture{
		t: t, pool: pool, store: store, topic: "orders", runs: map[string]int{},
		table:  pgx.Identifier{schema, "effects"}.Sanitize(),
		broker: memsource.New(memsource.Config{VisibilityTimeout: 300 * time.Millisecond, Seed: 1}),
	}
	t.Cleanup(func() { f.broker.Close() })
	f.exec(`CREATE TABLE ` + f.table + ` (id bigserial PRIMARY KEY, key text NOT NULL, body text NOT NULL)`)
	return f
}

// visibility gives the fixture a broker of its own whose deliveries stay
// invisible for d: a test that must not see a redelivery on a loaded machine
// (an ack or retry that comes after the fixture's 300 ms) takes a longer one.
// Call it before publishing.
func (f *fixture) visibility(d time.Duration) {
	f.t.Helper()
	f.broker = memsource.New(memsource.Config{VisibilityTimeout: d, Seed: 1})
	f.t.Cleanup(func() { f.broker.Close() })
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatal(err)
	}
}

// publish publishes messages with the given keys and body "body-<key>".
func (f *fixture) publish(keys ...string) {
	for _, k := range keys {
		f.broker.Publish(f.topic, memsource.Outgoing{Key: k, Body: []byte("body-" + k)})
	}
}

func keys(n int, prefix string) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return ks
}

// handler writes one effect row per call and counts calls per key; fail, if
// set, decides whether a call fails after its write.
func (f *fixture) handler(fail func(msg *consumer.Message, call int) error) consumer.TxHandler[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		key, _ := consumer.DedupKey(ctx)
		f.mu.Lock()
		f.runs[key]++
		call := f.runs[key]
		f.mu.Unlock()
		if _, err := tx.Exec(ctx, `INSERT INTO `+f.table+` (key, body) VALUES ($1, $2)`, key, string(msg.Body)); err != nil {
			return err
		}
		if fail != nil {
			return fail(msg, call)
		}
		return nil
	}
}

func (f *fixture) calls(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runs[key]
}

// effects returns the number of committed effect rows per key.
func (f *fixture) effects() map[string]int {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT key, count(*) FROM `+f.table+` GROUP BY key`)
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]int{}
	var k string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { out[k] = n; return nil }); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// requireOnce fails unless every key has exactly one effect and no other
// key has any.
func (f *fixture) requireOnce(ks ...string) {
	f.t.Helper()
	got := f.effects()
	for _, k := range ks {
		if got[k] != 1 {
			f.t.Errorf("key %s: %d effects, want exactly 1", k, got[k])
		}
		delete(got, k)
	}
	for k, n := range got {
		f.t.Errorf("unexpected key %s: %d effects", k, n)
	}
}

func (f *fixture) config(cfg consumer.Config) consumer.Config {
	if cfg.Retry.InitialBackoff == 0 {
		cfg.Retry.InitialBackoff = 10 * time.Millisecond
		cfg.Retry.MaxBackoff = 50 * time.Millisecond
	}
	if cfg.Logger == nil && testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

// running is a Runner started in the background; stop cancels it and
// waits for Run to return (calling it again does nothing).
type running struct {
	*consumer.Runner
	stop func()
}

func (f *fixture) start(src consumer.Source, path consumer.Path, cfg consumer.Config) *running {
	f.t.Helper()
	r, stop := startRunner(f.t, src, path, f.config(cfg))
	return &running{Runner: r, stop: stop}
}

// settled waits until the topic has nothing ready, in flight or pending.
func (f *fixture) settled() memsource.TopicStats {
	f.t.Helper()
	return f.waitFor("every message settled", func(st memsource.TopicStats) bool {
		return st.Ready == 0 && st.InFlight == 0 && st.Pending == 0
	})
}

func (f *fixture) waitFor(what string, cond func(memsource.TopicStats) bool) memsource.TopicStats {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := f.broker.Stats(f.topic)
		if bad := f.overBudget(); bad != "" {
			f.t.Fatalf("waiting for %s: %s (%+v)", what, bad, st)
		}
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s: %+v", what, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recordingStore wraps a store's driver and remembers which keys each
// transaction committed, so tests can check that nothing is acknowledged
// before its commit. It reports no capability (Caps{}): the runner begins,
// claims and commits through it, one step at a time.
type recordingStore struct {
	dedupdriver.Tx[pgx.Tx]
	mu        sync.Mutex
	claimed   map[pgx.Tx][]string
	committed map[string]bool
	failNext  int // commits to fail (after the real commit is skipped)
}

func newRecordingStore(s dedupdriver.TxStore[pgx.Tx]) *recordingStore {
	return &recordingStore{Tx: s.Driver(), claimed: map[pgx.Tx][]string{}, committed: map[string]bool{}}
}

func (s *recordingStore) Driver() dedupdriver.Tx[pgx.Tx] { return s }

func (s *recordingStore) Caps() dedupdriver.Caps { return dedupdriver.Caps{} }

func (s *recordingStore) Claim(ctx context.Context, tx pgx.Tx, scope string, recs []dedup.Record) ([]dedup.Claim, error) {
	cs, err := s.Tx.Claim(ctx, tx, scope, recs)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		if c.State == dedup.StateNew {
			s.claimed[tx] = append(s.claimed[tx], c.Key)
		}
	}
	return cs, err
}

func (s *recordingStore) Commit(ctx context.Context, tx pgx.Tx) error {
	s.mu.Lock()
	fail := s.failNext > 0
	if fail {
		s.failNext--
	}
	s.mu.Unlock()
	if fail {
		_ = s.Tx.Rollback(ctx, tx)
		return pgx.ErrTxCommitRollback
	}
	if err := s.Tx.Commit(ctx, tx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range s.claimed[tx] {
		s.committed[k] = true
	}
	delete(s.claimed, tx)
	return nil
}

func (s *recordingStore) isCommitted(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed[key]
}

// checkingSource fails the test when a message is acknowledged before the
// transaction that recorded its key committed.
type checkingSource struct {
	consumer.Source
	t     *testing.T
	store *recordingStore
	mu    sync.Mutex
	acked int
}

func (s *checkingSource) Ack(ctx context.Context, msgs []*consumer.Message) error {
	for _, m := range msgs {
		if !s.store.isCommitted(m.Key) {
			s.t.Errorf("message %s (key %s) acknowledged before its record committed", m.ID, m.Key)
		}
	}
	s.mu.Lock()
	s.acked += len(msgs)
	s.mu.Unlock()
	return s.Source.Ack(ctx, msgs)
}
