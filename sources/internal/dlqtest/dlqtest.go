// Package dlqtest holds what the tests of the dead-letter stores (amqpdlq,
// kafkadlq, sqsdlq) share: the scenario every store runs against its real
// broker (a real runner dead-letters poison messages, List filters them, a
// replay is SIGKILLed halfway and run again, and every message takes effect
// once in PostgreSQL), the effects database, and the replay child process
// the scenario kills.
package dlqtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
)

// WaitTimeout bounds every wait of the dead-letter stores' tests.
const WaitTimeout = 45 * time.Second

// Rig is one broker's part of the scenario.
type Rig struct {
	// Publish sends a message with the deduplication key key (in the
	// header or attribute "idempotency-key") and the user header
	// "tenant" to the origin.
	Publish func(t *testing.T, key, body string)
	// Source opens a source of the origin that dead-letters to the
	// dead-letter store.
	Source func(t *testing.T) consumer.Source
	// Broker opens the dead-letter store.
	Broker func(t *testing.T) dlq.Broker
	// Again makes each dead letter replayed so far be replayed once more
	// by the next Replay: what a replay interrupted between the origin's
	// confirm and the removal does (Kafka: rewind the progress; SQS and
	// RabbitMQ: a second copy of each dead letter, made before the first
	// replay).
	Again func(t *testing.T, b dlq.Broker)
	// AgainBefore: Again runs before the first replay, else after it.
	AgainBefore bool
	// ChildEnv is what the replay child needs to open the broker (see
	// ReplayChild).
	ChildEnv []string
	// KillInWindow: the child's broker can be killed after the origin
	// confirmed a copy and before its dead letter is removed (see
	// KillAtRemoval), so that copy is sent twice.
	KillInWindow bool
}

// Poison holds the poison messages, by key, and the reason their handler
// gives while it is broken.
var Poison = map[string]string{
	"order-2": "bad SKU 17",
	"order-3": "bad SKU 4",
	"order-5": "bad SKU 9",
	"order-7": "card declined",
}

// messages is how many messages the scenario publishes: KeyOf(1) to
// KeyOf(messages).
const messages = 8

// KeyOf is the key of the scenario's i-th message.
func KeyOf(i int) string { return "order-" + strconv.Itoa(i) }

// EffectsDB is the handler's database: an effects table and the runner's
// processed-message records, in a schema of the test's own.
type EffectsDB struct {
	pool *pgxpool.Pool
	// Store keeps the runner's processed-message records.
	Store *pgdedup.Store
}

// NewEffectsDB creates the effects table and the runner's tables in a
// schema of the test's own.
func NewEffectsDB(t *testing.T) *EffectsDB {
	t.Helper()
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	surl, err := testenv.WithSearchPath(url, schema)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, surl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (key text NOT NULL, tenant text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &EffectsDB{pool: pool, Store: store}
}

// Effects returns how many times each key took effect; it fails t for an
// effect whose tenant header is not the user's ("acme").
func (d *EffectsDB) Effects(t *testing.T) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := d.pool.Query(ctx, `SELECT key, tenant FROM effects`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var k, tenant string
		if err := rows.Scan(&k, &tenant); err != nil {
			t.Fatal(err)
		}
		if tenant != "acme" {
			t.Errorf("key %s took effect with tenant header %q, want the user's header kept (acme)", k, tenant)
		}
		out[k]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Runner returns a runner whose handler fails the poison messages for good
// while broken is set, and records the effect of every other message.
func (d *EffectsDB) Runner(t *testing.T, src consumer.Source, broken *atomic.Bool) *consumer.Runner {
	t.Helper()
	r, err := consumer.NewRunner(src, consumer.Transactional(d.Store, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		if reason, ok := Poison[msg.Key]; ok && broken.Load() {
			return consumer.Permanent(errors.New(reason))
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, tenant) VALUES ($1, $2)`, msg.Key, msg.Headers["tenant"])
		return err
	}), consumer.Config{Name: "orders", Concurrency: 2, Logger: runtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// KeysOf returns the keys of ls, sorted.
func KeysOf(ls []*dlq.Letter) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Key)
	}
	slices.Sort(out)
	return out
}

// List lists the dead letters of b that f selects, and fails t on an error.
func List(t *testing.T, b dlq.Broker, f dlq.Filter) []*dlq.Letter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	ls, err := dlq.List(ctx, b, f)
	if err != nil {
		t.Fatalf("List(%+v): %v", f, err)
	}
	return ls
}

// RunScenario runs the scenario on rg: poison messages dead-lettered by a
// real runner; filters; purge --dry-run; the handler fixed; a replay
// SIGKILLed halfway and run again; every message applied once, and the dead
// letters replayed twice absorbed.
func RunScenario(t *testing.T, rg Rig) {
	db := NewEffectsDB(t)
	start := time.Now().Add(-time.Second)
	for i := 1; i <= messages; i++ {
		rg.Publish(t, KeyOf(i), fmt.Sprintf(`{"order":%d}`, i))
	}
	var broken atomic.Bool
	broken.Store(true)
	src := rg.Source(t)
	r := db.Runner(t, src, &broken)
	runtest.RunUntil(t, func() bool {
		st := r.Stats()
		return st.Handled >= messages-uint64(len(Poison)) && st.DeadLettered >= uint64(len(Poison))
	}, r)
	_ = src.Close() // a Kafka consumer leaves its group

	b := rg.Broker(t)
	t.Cleanup(func() { b.Close() })
	var want []string
	for k := range Poison {
		want = append(want, k)
	}
	slices.Sort(want)
	all := List(t, b, dlq.Filter{})
	if got := KeysOf(all); !slices.Equal(got, want) {
		t.Fatalf("dead letters %v, want %v", got, want)
	}
	for _, l := range all {
		if !strings.Contains(l.Reason, Poison[l.Key]) || l.Origin == "" || l.DeadLetteredAt.Before(start) || string(l.Body) != fmt.Sprintf(`{"order":%s}`, l.Key[len("order-"):]) {
			t.Errorf("dead letter %+v: want a reason with %q, an origin, a time after %s and the body", l, Poison[l.Key], start)
		}
		if l.Headers["tenant"] != "acme" {
			t.Errorf("dead letter %s: user header tenant=%q, want acme", l.Key, l.Headers["tenant"])
		}
	}

	t.Run("filters", func(t *testing.T) {
		for _, c := range []struct {
			f    dlq.Filter
			want []string
		}{
			{dlq.Filter{Reason: "sku"}, []string{"order-2", "order-3", "order-5"}},
			{dlq.Filter{Reason: "declined"}, []string{"order-7"}},
			{dlq.Filter{Key: "order-[57]"}, []string{"order-5", "order-7"}},
			{dlq.Filter{Key: "order-?", Reason: "SKU 4"}, []string{"order-3"}},
			{dlq.Filter{Since: time.Now().Add(time.Hour)}, nil},
			{dlq.Filter{Until: start}, nil},
			{dlq.Filter{Since: start, Until: time.Now().Add(time.Hour)}, want},
		} {
			if got := KeysOf(List(t, b, c.f)); !slices.Equal(got, c.want) {
				t.Errorf("List(%+v) = %v, want %v", c.f, got, c.want)
			}
		}
		if got := List(t, b, dlq.Filter{Limit: 2}); len(got) != 2 {
			t.Errorf("List(limit 2) returned %d dead letters", len(got))
		}
	})

	t.Run("purge dry run", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
		defer cancel()
		res, err := dlq.Purge(ctx, b, dlq.Filter{}, dlq.Options{DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Letters) != len(Poison) || res.Done != 0 {
			t.Errorf("dry-run purge selected %d, did %d; want %d selected, 0 done", len(res.Letters), res.Done, len(Poison))
		}
		if got := KeysOf(List(t, b, dlq.Filter{})); !slices.Equal(got, want) {
			t.Fatalf("after a dry-run purge the dead letters are %v, want %v", got, want)
		}
	})
	if t.Failed() {
		return
	}

	if rg.AgainBefore {
		rg.Again(t, b)
	}
	// The handler is fixed; a replay is killed after two dead letters, then
	// run again.
	broken.Store(false)
	total := len(all)
	if rg.AgainBefore {
		total *= 2
	}
	env := append([]string{childEnvVar + "=" + t.Name(), killAfterEnv + "=2"}, rg.ChildEnv...)
	if rg.KillInWindow {
		env = append(env, inWindowEnv+"=1")
	}
	child := runtest.StartChild(t, ChildTest, env)
	select {
	case <-child.Done():
	case <-time.After(WaitTimeout):
		t.Fatalf("the replay child did not end:\n%s", child.Output())
	}
	if !child.Killed() {
		t.Fatalf("the replay child was not killed: %v\n%s", child.Err(), child.Output())
	}
	// What the child held comes back (at once on RabbitMQ, after its scan's
	// visibility timeout on SQS): exactly the two it replayed are gone.
	var left []*dlq.Letter
	runtest.WaitFor(t, WaitTimeout, func() string {
		return fmt.Sprintf("%d dead letters left after the killed replay, want %d", len(left), total-2)
	}, func() bool {
		left = List(t, b, dlq.Filter{})
		return len(left) == total-2
	})
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	res, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{})
	if err != nil {
		t.Fatalf("replay after the kill: %v", err)
	}
	t.Logf("the killed replay left %d dead letters; the second replay sent %d", len(left), res.Done)
	if ls := List(t, b, dlq.Filter{}); len(ls) != 0 {
		t.Fatalf("%d dead letters left after the replay: %v", len(ls), KeysOf(ls))
	}
	if !rg.AgainBefore {
		rg.Again(t, b)
		if res, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{}); err != nil || res.Done != len(Poison) {
			t.Fatalf("replay again: %d sent, %v; want %d", res.Done, err, len(Poison))
		}
	}

	r = db.Runner(t, rg.Source(t), &broken)
	defer func() {
		if t.Failed() {
			t.Logf("runner after the replay: %+v; effects %v", r.Stats(), db.Effects(t))
		}
	}()
	// Each poison message arrives twice (replayed twice), and once more
	// when the child was killed between a copy and its removal.
	deliveries := uint64(2 * len(Poison))
	if rg.KillInWindow {
		deliveries++
	}
	runtest.RunUntil(t, func() bool { return r.Stats().Received >= deliveries }, r)
	t.Logf("the runner after the replays: %+v", r.Stats())
	eff := db.Effects(t)
	for i := 1; i <= messages; i++ {
		if n := eff[KeyOf(i)]; n != 1 {
			t.Errorf("%s took effect %d times, want once", KeyOf(i), n)
		}
	}
	if st := r.Stats(); st.DeadLettered != 0 || st.Handled != uint64(len(Poison)) || st.Duplicates < deliveries-uint64(len(Poison)) {
		t.Errorf("runner after the replays: %+v; want %d handled, at least %d duplicates, none dead-lettered", st, len(Poison), deliveries-uint64(len(Poison)))
	}
}

// Environment of the replay child.
const (
	childEnvVar  = "IDEMQ_DLQ_REPLAY_CHILD"
	killAfterEnv = "IDEMQ_DLQ_REPLAY_KILL_AFTER"
	// inWindowEnv, set by a Rig whose child broker can tell when a dead
	// letter is about to be removed (Kafka: the progress record; SQS:
	// DeleteMessage), has the child killed there, after the origin
	// confirmed the next copy and before that dead letter is removed,
	// instead of between two dead letters.
	inWindowEnv = "IDEMQ_DLQ_KILL_IN_WINDOW"
)

// killAfter is the number of dead letters the replay child removes before it
// is killed.
func killAfter() int {
	n, _ := strconv.Atoi(os.Getenv(killAfterEnv))
	return n
}

// KillAtRemoval counts the removals the child is about to make and
// SIGKILLs the process at the one after killAfter().
func KillAtRemoval(n *atomic.Int64) {
	if n.Add(1) > int64(killAfter()) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// ChildTest is the name of the test that is the replay child: each package
// that runs the scenario has a test of that name that calls ReplayChild.
const ChildTest = "TestHelperReplayChild"

// ReplayChild is the replay child process: it replays every dead letter of
// the broker that open opens from the environment the rig's ChildEnv set,
// and SIGKILLs itself once IDEMQ_DLQ_REPLAY_KILL_AFTER of them were
// replayed (removed from the dead-letter store after their origin's
// confirm): before it goes on, or, with IDEMQ_DLQ_KILL_IN_WINDOW, once the
// next copy is confirmed and before its dead letter is removed (the
// broker's hook calls KillAtRemoval). Run outside the scenario, it skips.
func ReplayChild(t *testing.T, open func(t *testing.T, env func(string) string) dlq.Broker) {
	if os.Getenv(childEnvVar) == "" {
		t.Skip("helper process of a replay crash test")
	}
	b := open(t, os.Getenv)
	defer b.Close()
	after := killAfter()
	if os.Getenv(inWindowEnv) == "1" {
		after = 1 << 30 // the broker's hook kills it
	}
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	_, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{Progress: func(done int) {
		if done >= after {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}})
	t.Fatalf("replay ended before the kill: %v", err)
}

// CheckMissingFields checks the error of a dead-letter store's New given a
// Config without its required fields: it matches idemq.ErrInvalidConfig, is
// a *idemq.ConfigError, and names each of fields.
func CheckMissingFields(t *testing.T, err error, fields ...string) {
	t.Helper()
	if !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Fatalf("New(Config{}) = %v, want an error matching idemq.ErrInvalidConfig", err)
	}
	var ce *idemq.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("New(Config{}) = %v, want a *idemq.ConfigError", err)
	}
	for _, f := range fields {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("New(Config{}) = %v, want it to name %s", err, f)
		}
	}
}
