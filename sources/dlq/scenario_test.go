package dlq_test

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

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/dlq"
)

// waitTimeout bounds every wait of these tests.
const waitTimeout = 45 * time.Second

// rig is one broker's part of the scenario.
type rig struct {
	// publish sends a message with the deduplication key key (in the
	// header or attribute "idempotency-key") and the user header
	// "tenant" to the origin.
	publish func(t *testing.T, key, body string)
	// source opens a source of the origin that dead-letters to the
	// dead-letter store.
	source func(t *testing.T) consumer.Source
	// broker opens the dead-letter store.
	broker func(t *testing.T) dlq.Broker
	// again makes each dead letter replayed so far be replayed once more
	// by the next Replay: what a replay interrupted between the origin's
	// confirm and the removal does (Kafka: rewind the progress; SQS and
	// RabbitMQ: a second copy of each dead letter, made before the first
	// replay).
	again func(t *testing.T, b dlq.Broker)
	// againBefore: again runs before the first replay, else after it.
	againBefore bool
	// childEnv is what the replay child needs to open the broker (see
	// childBrokers).
	childEnv []string
	// killInWindow: the child's broker can be killed after the origin
	// confirmed a copy and before its dead letter is removed (inWindowEnv),
	// so that copy is sent twice.
	killInWindow bool
}

// The poison messages, by key, and the reason their handler gives.
var poison = map[string]string{
	"order-2": "bad SKU 17",
	"order-3": "bad SKU 4",
	"order-5": "bad SKU 9",
	"order-7": "card declined",
}

const messages = 8

func keyOf(i int) string { return "order-" + strconv.Itoa(i) }

// effectsDB is the handler's database: an effects table and the runner's
// processed-message records, in a schema of the test's own.
type effectsDB struct {
	pool  *pgxpool.Pool
	store *pgdedup.Store
}

func newEffectsDB(t *testing.T) *effectsDB {
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
	return &effectsDB{pool: pool, store: store}
}

// effects returns how many times each key took effect.
func (d *effectsDB) effects(t *testing.T) map[string]int {
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

// runner returns a runner whose handler fails the poison messages for good
// while broken is set.
func (d *effectsDB) runner(t *testing.T, src consumer.Source, broken *atomic.Bool) *consumer.Runner {
	t.Helper()
	r, err := consumer.NewRunner(src, consumer.Transactional(d.store, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		if reason, ok := poison[msg.Key]; ok && broken.Load() {
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

func keysOf(ls []*dlq.Letter) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Key)
	}
	slices.Sort(out)
	return out
}

func list(t *testing.T, b dlq.Broker, f dlq.Filter) []*dlq.Letter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	ls, err := dlq.List(ctx, b, f)
	if err != nil {
		t.Fatalf("List(%+v): %v", f, err)
	}
	return ls
}

// runScenario: poison messages dead-lettered by a real runner; filters;
// purge --dry-run; the handler fixed; a replay SIGKILLed halfway and run
// again; every message applied once, and the dead letters replayed twice
// absorbed.
func runScenario(t *testing.T, rg rig) {
	db := newEffectsDB(t)
	start := time.Now().Add(-time.Second)
	for i := 1; i <= messages; i++ {
		rg.publish(t, keyOf(i), fmt.Sprintf(`{"order":%d}`, i))
	}
	var broken atomic.Bool
	broken.Store(true)
	src := rg.source(t)
	r := db.runner(t, src, &broken)
	runtest.RunUntil(t, func() bool {
		st := r.Stats()
		return st.Handled >= messages-uint64(len(poison)) && st.DeadLettered >= uint64(len(poison))
	}, r)
	_ = src.Close() // a Kafka consumer leaves its group

	b := rg.broker(t)
	t.Cleanup(func() { b.Close() })
	var want []string
	for k := range poison {
		want = append(want, k)
	}
	slices.Sort(want)
	all := list(t, b, dlq.Filter{})
	if got := keysOf(all); !slices.Equal(got, want) {
		t.Fatalf("dead letters %v, want %v", got, want)
	}
	for _, l := range all {
		if !strings.Contains(l.Reason, poison[l.Key]) || l.Origin == "" || l.DeadLetteredAt.Before(start) || string(l.Body) != fmt.Sprintf(`{"order":%s}`, l.Key[len("order-"):]) {
			t.Errorf("dead letter %+v: want a reason with %q, an origin, a time after %s and the body", l, poison[l.Key], start)
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
			if got := keysOf(list(t, b, c.f)); !slices.Equal(got, c.want) {
				t.Errorf("List(%+v) = %v, want %v", c.f, got, c.want)
			}
		}
		if got := list(t, b, dlq.Filter{Limit: 2}); len(got) != 2 {
			t.Errorf("List(limit 2) returned %d dead letters", len(got))
		}
	})

	t.Run("purge dry run", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		res, err := dlq.Purge(ctx, b, dlq.Filter{}, dlq.Options{DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Letters) != len(poison) || res.Done != 0 {
			t.Errorf("dry-run purge selected %d, did %d; want %d selected, 0 done", len(res.Letters), res.Done, len(poison))
		}
		if got := keysOf(list(t, b, dlq.Filter{})); !slices.Equal(got, want) {
			t.Fatalf("after a dry-run purge the dead letters are %v, want %v", got, want)
		}
	})
	if t.Failed() {
		return
	}

	if rg.againBefore {
		rg.again(t, b)
	}
	// The handler is fixed; a replay is killed after two dead letters, then
	// run again.
	broken.Store(false)
	total := len(all)
	if rg.againBefore {
		total *= 2
	}
	env := append([]string{childEnvVar + "=" + rootName(t.Name()), killAfterEnv + "=2"}, rg.childEnv...)
	if rg.killInWindow {
		env = append(env, inWindowEnv+"=1")
	}
	child := runtest.StartChild(t, "TestHelperReplayChild", env)
	select {
	case <-child.Done():
	case <-time.After(waitTimeout):
		t.Fatalf("the replay child did not end:\n%s", child.Output())
	}
	if !child.Killed() {
		t.Fatalf("the replay child was not killed: %v\n%s", child.Err(), child.Output())
	}
	// What the child held comes back (at once on RabbitMQ, after its scan's
	// visibility timeout on SQS): exactly the two it replayed are gone.
	var left []*dlq.Letter
	runtest.WaitFor(t, waitTimeout, func() string {
		return fmt.Sprintf("%d dead letters left after the killed replay, want %d", len(left), total-2)
	}, func() bool {
		left = list(t, b, dlq.Filter{})
		return len(left) == total-2
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	res, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{})
	if err != nil {
		t.Fatalf("replay after the kill: %v", err)
	}
	t.Logf("the killed replay left %d dead letters; the second replay sent %d", len(left), res.Done)
	if ls := list(t, b, dlq.Filter{}); len(ls) != 0 {
		t.Fatalf("%d dead letters left after the replay: %v", len(ls), keysOf(ls))
	}
	if !rg.againBefore {
		rg.again(t, b)
		if res, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{}); err != nil || res.Done != len(poison) {
			t.Fatalf("replay again: %d sent, %v; want %d", res.Done, err, len(poison))
		}
	}

	r = db.runner(t, rg.source(t), &broken)
	defer func() {
		if t.Failed() {
			t.Logf("runner after the replay: %+v; effects %v", r.Stats(), db.effects(t))
		}
	}()
	// Each poison message arrives twice (replayed twice), and once more
	// when the child was killed between a copy and its removal.
	deliveries := uint64(2 * len(poison))
	if rg.killInWindow {
		deliveries++
	}
	runtest.RunUntil(t, func() bool { return r.Stats().Received >= deliveries }, r)
	t.Logf("the runner after the replays: %+v", r.Stats())
	eff := db.effects(t)
	for i := 1; i <= messages; i++ {
		if n := eff[keyOf(i)]; n != 1 {
			t.Errorf("%s took effect %d times, want once", keyOf(i), n)
		}
	}
	if st := r.Stats(); st.DeadLettered != 0 || st.Handled != uint64(len(poison)) || st.Duplicates < deliveries-uint64(len(poison)) {
		t.Errorf("runner after the replays: %+v; want %d handled, at least %d duplicates, none dead-lettered", st, len(poison), deliveries-uint64(len(poison)))
	}
}

// Environment of the replay child.
const (
	childEnvVar  = "IDEMQ_DLQ_REPLAY_CHILD"
	killAfterEnv = "IDEMQ_DLQ_REPLAY_KILL_AFTER"
	// inWindowEnv, set by a rig whose child broker can tell when a dead
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

// killAtRemoval counts the removals the child is about to make and
// SIGKILLs the process at the one after killAfter().
func killAtRemoval(n *atomic.Int64) {
	if n.Add(1) > int64(killAfter()) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// childBrokers open the dead-letter store of a replay child, by the name of
// the test that started it, from rig.childEnv.
var childBrokers = map[string]func(t *testing.T, env func(string) string) dlq.Broker{}

// TestHelperReplayChild is the replay child process: it replays every dead
// letter of the broker the parent names, and SIGKILLs itself once
// IDEMQ_DLQ_REPLAY_KILL_AFTER of them were replayed (removed from the
// dead-letter store after their origin's confirm): before it goes on, or,
// with IDEMQ_DLQ_KILL_IN_WINDOW, once the next copy is confirmed and before
// its dead letter is removed.
func TestHelperReplayChild(t *testing.T) {
	name := os.Getenv(childEnvVar)
	if name == "" {
		t.Skip("helper process of a replay crash test")
	}
	open, ok := childBrokers[rootName(name)]
	if !ok {
		t.Fatalf("no broker for %q", name)
	}
	b := open(t, os.Getenv)
	defer b.Close()
	after := killAfter()
	if os.Getenv(inWindowEnv) == "1" {
		after = 1 << 30 // the broker's hook kills it
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	_, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{Progress: func(done int) {
		if done >= after {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}})
	t.Fatalf("replay ended before the kill: %v", err)
}

// rootName is the top-level test of a test name.
func rootName(name string) string {
	for i, c := range name {
		if c == '/' {
			return name[:i]
		}
	}
	return name
}
