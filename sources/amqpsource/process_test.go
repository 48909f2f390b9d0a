package amqpsource_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/amqpsource"
)

// Environment of the helper worker process.
const (
	envHelper      = "IDEMQ_AMQPSOURCE_HELPER"
	envHelperAMQP  = "IDEMQ_AMQPSOURCE_HELPER_AMQP"
	envHelperQueue = "IDEMQ_AMQPSOURCE_HELPER_QUEUE"
	envHelperDB    = "IDEMQ_AMQPSOURCE_HELPER_DB"
	envHelperSch   = "IDEMQ_AMQPSOURCE_HELPER_SCHEMA"
	envHelperBatch = "IDEMQ_AMQPSOURCE_HELPER_BATCH"
	envHelperWork  = "IDEMQ_AMQPSOURCE_HELPER_WORK"
)

// TestHelperWorker is not a test: it is the worker process that the process
// tests start (this test binary, re-executed with envHelper set) and kill.
// It runs a Runner with a one-UPSERT handler until SIGTERM, then drains,
// prints its stats as JSON and exits.
func TestHelperWorker(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("helper process for the process-kill tests")
	}
	batch, _ := strconv.Atoi(os.Getenv(envHelperBatch))
	work, _ := time.ParseDuration(os.Getenv(envHelperWork))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // never outlive the parent by much
	defer cancel()

	db := openDatabase(t, os.Getenv(envHelperDB), os.Getenv(envHelperSch))
	rc := consumer.Config{Name: "worker", Concurrency: 2, BatchSize: batch}
	src, err := amqpsource.New(ctx, amqpsource.Config{
		URL: os.Getenv(envHelperAMQP), Queue: os.Getenv(envHelperQueue),
		Prefetch: amqpsource.PrefetchFor(rc),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	r, err := consumer.NewRunner(src, consumer.Transactional(db.store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := apply(ctx, tx, m.Key); err != nil {
			return err
		}
		time.Sleep(work) // inside the transaction: a kill lands mid-batch
		return nil
	}), rc)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("worker: ready")
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(r.Stats())
	fmt.Printf("worker: stats %s\n", b)
}

// startWorker starts a helper worker on queue and waits until it consumes.
func startWorker(t *testing.T, url, queue string, db *database, batch int, work time.Duration) *runtest.Child {
	t.Helper()
	w := runtest.StartChild(t, "TestHelperWorker", []string{
		envHelper + "=1",
		envHelperAMQP + "=" + url,
		envHelperQueue + "=" + queue,
		envHelperDB + "=" + db.url,
		envHelperSch + "=" + db.schema,
		envHelperBatch + "=" + strconv.Itoa(batch),
		envHelperWork + "=" + work.String(),
	})
	w.Expect(t, "worker: ready", testTimeout)
	return w
}

// stopWorker sends SIGTERM, waits for the graceful exit and returns the
// worker's stats.
func stopWorker(t *testing.T, w *runtest.Child) consumer.Stats {
	t.Helper()
	if err := syscall.Kill(w.Pid(), syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM worker %d: %v", w.Pid(), err)
	}
	line := w.Expect(t, "worker: stats ", testTimeout)
	var s consumer.Stats
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "worker: stats ")), &s); err != nil {
		t.Fatalf("worker stats %q: %v", line, err)
	}
	select {
	case <-w.Done():
	case <-time.After(testTimeout):
		t.Fatalf("worker %d did not exit after SIGTERM", w.Pid())
	}
	if err := w.Err(); err != nil {
		t.Errorf("worker %d exited: %v", w.Pid(), err)
	}
	return s
}

// A real process kill mid-stream: SIGKILL the worker while its batches are
// inside their transactions, start a new one, and count the rows.
func TestProcessKill(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	db := newDatabase(t)
	q := newQueue(t, url, quorum, 0)
	out := outgoing("kill", 300)
	publish(t, url, q, out...)

	w := startWorker(t, url, q, db, 10, 2*time.Millisecond)
	runtest.WaitFor(t, testTimeout, runtest.Say("100 effects"), func() bool { return len(db.effects(t)) >= 100 })
	w.Kill()
	applied := len(db.effects(t))
	if applied == len(out) {
		t.Fatalf("the worker finished all %d messages before it was killed; the test proves nothing", applied)
	}
	t.Logf("killed the worker after %d of %d effects", applied, len(out))

	w = startWorker(t, url, q, db, 10, 2*time.Millisecond)
	runtest.WaitFor(t, testTimeout, runtest.Say("300 effects"), func() bool { return len(db.effects(t)) == len(out) })
	s := stopWorker(t, w)
	t.Logf("second worker: %+v", s)
	db.requireExactlyOnce(t, keysOf(out))
	if d := queueDepth(t, url, q); d != 0 {
		t.Errorf("%d messages left in the queue after a graceful stop", d)
	}
	if s.Handled+s.Duplicates < uint64(len(out)-applied) {
		t.Errorf("second worker settled %d messages, want at least the %d left", s.Handled+s.Duplicates, len(out)-applied)
	}
}

// Two competing workers on one queue; one is killed mid-batch. The other
// takes over its unacknowledged deliveries; every effect is applied once.
func TestCompetingConsumersOneKilledMidBatch(t *testing.T) {
	t.Parallel()
	url := brokerURL(t)
	db := newDatabase(t)
	q := newQueue(t, url, quorum, 0)
	out := outgoing("compete", 400)
	publish(t, url, q, out...)

	a := startWorker(t, url, q, db, 20, 2*time.Millisecond)
	b := startWorker(t, url, q, db, 20, 2*time.Millisecond)
	runtest.WaitFor(t, testTimeout, runtest.Say("100 effects"), func() bool { return len(db.effects(t)) >= 100 })
	a.Kill()
	applied := len(db.effects(t))
	if applied == len(out) {
		t.Fatalf("the workers finished all %d messages before one was killed; the test proves nothing", applied)
	}
	runtest.WaitFor(t, testTimeout, runtest.Say("400 effects"), func() bool { return len(db.effects(t)) == len(out) })
	s := stopWorker(t, b)
	t.Logf("killed worker A after %d of %d effects; worker B: %+v", applied, len(out), s)
	db.requireExactlyOnce(t, keysOf(out))
	if d := queueDepth(t, url, q); d != 0 {
		t.Errorf("%d messages left in the queue after a graceful stop", d)
	}
}
