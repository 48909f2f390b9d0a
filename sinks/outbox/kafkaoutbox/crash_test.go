package kafkaoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
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
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/internal/relaytest"
	"github.com/idemq/idemq/sinks/outbox/kafkaoutbox"
	"github.com/idemq/idemq/sources/kafkasource"
)

// Environment of the relay child process.
const (
	childEnv      = "IDEMQ_OUTBOX_RELAY_CHILD" // "1" in the child
	childURLEnv   = "IDEMQ_OUTBOX_RELAY_DB"
	childKillEnv  = "IDEMQ_OUTBOX_RELAY_KILL_AFTER" // confirmed batches after which the child kills itself
	childBatchEnv = "IDEMQ_OUTBOX_RELAY_BATCH"
)

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
		fmt.Printf("KILL after %d confirmed messages\n", len(msgs))
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	return err
}

// TestHelperRelayChild is the relay process of TestRelayCrash. It does
// nothing when run on its own.
func TestHelperRelayChild(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("helper process of TestRelayCrash")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pub, err := kafkaoutbox.New(kafkaoutbox.Config{Brokers: testenv.KafkaBrokers(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	after, _ := strconv.ParseInt(os.Getenv(childKillEnv), 10, 64)
	cfg := relaytest.FastConfig()
	cfg.BatchSize, _ = strconv.Atoi(os.Getenv(childBatchEnv))
	r, err := outbox.NewRelay(pool, &killingPublisher{Publisher: pub, after: after}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRelayCrash kills the relay process with SIGKILL between the broker's
// confirm and the row update, many times, until every row is sent; then an
// idemq consumer (kafkasource + pgdedup) reads the topic: it sees duplicate
// deliveries, but applies every event exactly once and misses none.
func TestRelayCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes; skipped with -short")
	}
	const (
		n     = 1000
		keys  = 8
		batch = 7
		kills = 40
	)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers)
	pool, schema, dbURL := relaytest.NewPool(t)
	want := relaytest.Messages("e", topic, n, keys)
	relaytest.Insert(t, pool, want)

	run := func(killAfter int) (killed bool, out string) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRelayChild$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(),
			childEnv+"=1",
			childURLEnv+"="+dbURL,
			childKillEnv+"="+strconv.Itoa(killAfter),
			childBatchEnv+"="+strconv.Itoa(batch),
			testenv.EnvKafkaBrokers+"="+strings.Join(brokers, ","),
		)
		var buf strings.Builder
		cmd.Stdout, cmd.Stderr = &buf, &buf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
					return true, buf.String()
				}
			}
			t.Fatalf("relay child ended without being killed: %v\n%s", err, buf.String())
		case <-time.After(relaytest.WaitTimeout):
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("relay child did not kill itself:\n%s", buf.String())
		}
		return false, ""
	}
	killed := 0
	for i := 0; killed < kills; i++ {
		pending := relaytest.Counts(t, pool).Pending
		if pending == 0 {
			break
		}
		// Kill after the 1st, 2nd or 3rd confirmed batch, if that many remain.
		after := min(1+i%3, int((pending+batch-1)/batch))
		if k, _ := run(after); k {
			killed++
		}
	}
	if killed < kills {
		t.Fatalf("only %d kills before all rows were sent; the test proves too little", killed)
	}
	t.Logf("%d relay processes SIGKILLed between confirm and update; %s", killed, relaytest.Describe(t, pool))
	// A relay that is not killed finishes the rest.
	relaytest.StartRelays(t, pool, newPublisher(t, brokers), 1, relaytest.FastConfig())
	relaytest.WaitFor(t, func() string { return relaytest.Describe(t, pool) }, func() bool {
		return relaytest.Counts(t, pool).Sent == n
	})
	got := readAll(t, brokers, topic)
	dups := relaytest.Check(t, want, got, true)
	if dups == 0 {
		t.Fatalf("no duplicate deliveries in the topic after %d kills; the test proves nothing", killed)
	}
	t.Logf("topic holds %d messages for %d events: %d duplicates from the kills", len(got), n, dups)

	// The downstream consumer: effect and record in one transaction.
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
	src, err := kafkasource.New(kafkasource.Config{Brokers: brokers, Topics: []string{topic}, GroupID: topic + "-downstream", Logger: relaytest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	r, err := consumer.NewRunner(src, consumer.Transactional(store, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, body) VALUES ($1, $2)`, msg.Key, string(msg.Body))
		return err
	}), consumer.Config{Name: "downstream", BatchSize: 20, Logger: relaytest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	relaytest.WaitFor(t, func() string { return fmt.Sprintf("%+v", r.Stats()) }, func() bool {
		s := r.Stats()
		return s.Handled+s.Duplicates >= uint64(len(got))
	})
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	var effects, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM effects`).Scan(&effects, &distinct); err != nil {
		t.Fatal(err)
	}
	s := r.Stats()
	t.Logf("downstream: %d deliveries, %d handled, %d duplicates absorbed; %d effects for %d distinct events", s.Handled+s.Duplicates, s.Handled, s.Duplicates, effects, distinct)
	if effects != n || distinct != n {
		t.Fatalf("%d effects for %d distinct events, want %d and %d: duplicate effects %d, missing events %d", effects, distinct, n, n, effects-distinct, n-distinct)
	}
	if s.Duplicates == 0 {
		t.Fatal("the consumer absorbed no duplicate; the test proves nothing")
	}
}
