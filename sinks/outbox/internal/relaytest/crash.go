package relaytest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sinks/outbox"
)

// Environment of the relay child process.
const (
	childEnv      = "IDEMQ_OUTBOX_RELAY_CHILD" // "1" in the child
	childURLEnv   = "IDEMQ_OUTBOX_RELAY_DB"
	childKillEnv  = "IDEMQ_OUTBOX_RELAY_KILL_AFTER" // confirmed batches after which the child kills itself
	childBatchEnv = "IDEMQ_OUTBOX_RELAY_BATCH"
)

// ChildTestName is the name of the test function each broker's package
// defines to run ChildMain.
const ChildTestName = "TestHelperRelayChild"

// killingPublisher SIGKILLs its own process right after the broker
// confirmed the after-th batch: between the confirm and the row update.
type killingPublisher struct {
	outbox.Publisher
	after     int64
	confirmed atomic.Int64
}

func (k *killingPublisher) Publish(ctx context.Context, msgs []outbox.Message) error {
	err := k.Publisher.Publish(ctx, msgs)
	if err == nil && k.after > 0 && k.confirmed.Add(1) >= k.after {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	return err
}

// ChildMain is the body of the relay child process: it runs a relay over
// the database the parent named, through the publisher newPub returns,
// and kills itself after the broker confirmed the number of batches the
// parent asked for. It skips the test when not started by RunKills.
func ChildMain(t *testing.T, newPub func(t *testing.T) outbox.Publisher) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("helper process of a relay crash test")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	after, _ := strconv.ParseInt(os.Getenv(childKillEnv), 10, 64)
	cfg := FastConfig()
	cfg.BatchSize, _ = strconv.Atoi(os.Getenv(childBatchEnv))
	r, err := outbox.NewRelay(pool, &killingPublisher{Publisher: newPub(t), after: after}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// Child is a process of this test binary (runtest.Child).
type Child = runtest.Child

// StartChild runs this test binary's test named test as a child process
// (runtest.StartChild).
func StartChild(t testing.TB, test string, env []string) *Child {
	t.Helper()
	return runtest.StartChild(t, test, env)
}

// RelayEnv is the environment of a relay child (ChildMain) over the
// database at dbURL that claims batches of batch rows and SIGKILLs itself
// right after the broker confirmed its killAfter-th batch (never when
// killAfter is 0).
func RelayEnv(dbURL string, killAfter, batch int) []string {
	return []string{
		childEnv + "=1",
		childURLEnv + "=" + dbURL,
		childKillEnv + "=" + strconv.Itoa(killAfter),
		childBatchEnv + "=" + strconv.Itoa(batch),
	}
}

// RunKills starts relay child processes (this test binary running
// ChildTestName, with env added) over the database at dbURL, each of
// which is SIGKILLed right after the broker confirmed its 1st, 2nd or 3rd
// batch of batch rows, until kills children were killed or no row is
// pending. It fails the test when fewer than kills kills happened, and
// returns the number of kills.
func RunKills(t *testing.T, pool *pgxpool.Pool, dbURL string, env []string, kills, batch int) int {
	t.Helper()
	run := func(killAfter int) {
		c := StartChild(t, ChildTestName, append(env[:len(env):len(env)], RelayEnv(dbURL, killAfter, batch)...))
		select {
		case <-c.Done():
			if !c.Killed() {
				t.Fatalf("relay child ended without being killed: %v\n%s", c.Err(), c.Output())
			}
		case <-time.After(WaitTimeout):
			c.Kill()
			t.Fatalf("relay child did not kill itself; %s\n%s", Describe(t, pool), c.Output())
		}
	}
	killed := 0
	for i := 0; killed < kills; i++ {
		pending := Counts(t, pool).Pending
		if pending == 0 {
			break
		}
		// Kill after the 1st, 2nd or 3rd confirmed batch, if that many remain.
		run(min(1+i%3, int((pending+int64(batch)-1)/int64(batch))))
		killed++
	}
	if killed < kills {
		t.Fatalf("only %d kills before all rows were sent; the test proves too little", killed)
	}
	return killed
}

// Downstream runs an idemq consumer over src, at batch, until it has
// taken deliveries messages: a Transactional handler over pgdedup (in
// schema) that inserts each event into an effects table, so that the effect
// and the event's record commit together. It then fails t unless each of
// the n events took effect exactly once and the consumer absorbed at least
// one duplicate (else the test proves nothing).
func Downstream(t *testing.T, pool *pgxpool.Pool, schema string, src consumer.Source, batch, deliveries, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (event_id text NOT NULL, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := consumer.NewRunner(src, consumer.Transactional(store, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, body) VALUES ($1, $2)`, msg.Key, string(msg.Body))
		return err
	}), consumer.Config{Name: "downstream", BatchSize: batch, Logger: Logger()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	WaitFor(t, func() string { return fmt.Sprintf("%+v", r.Stats()) }, func() bool {
		s := r.Stats()
		return s.Handled+s.Duplicates >= uint64(deliveries)
	})
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	var effects, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM effects`).Scan(&effects, &distinct); err != nil {
		t.Fatal(err)
	}
	if effects != n || distinct != n {
		t.Fatalf("%d effects for %d distinct events, want %d: duplicate effects %d, missing events %d", effects, distinct, n, effects-distinct, n-distinct)
	}
	s := r.Stats()
	t.Logf("downstream: %d deliveries, %d handled, %d duplicates absorbed; %d effects for %d distinct events", s.Handled+s.Duplicates, s.Handled, s.Duplicates, effects, distinct)
	if s.Duplicates == 0 {
		t.Fatal("the consumer absorbed no duplicate; the test proves nothing")
	}
}
