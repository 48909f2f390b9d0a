package sqssource_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/sqssource"
)

// fastRetry retries quickly so that the tests finish soon.
var fastRetry = consumer.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, MaxBackoff: time.Second, Jitter: -1}

// watchedSource counts the deliveries that arrive while a handler runs.
type watchedSource struct {
	consumer.Source
	running    *atomic.Int32 // handlers running now, shared by all sources
	received   atomic.Int64
	concurrent atomic.Int64 // received while a handler was running
}

func (w *watchedSource) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	msgs, err := w.Source.Receive(ctx, max)
	w.received.Add(int64(len(msgs)))
	if len(msgs) > 0 && w.running.Load() > 0 {
		w.concurrent.Add(int64(len(msgs)))
	}
	return msgs, err
}

// TestSlowHandler runs a handler slower than the visibility timeout on two
// competing workers. With the heartbeat the message is received once; without
// it, it is received again while the first handler still runs, and the
// effect still happens once.
func TestSlowHandler(t *testing.T) {
	t.Parallel()
	for _, heartbeat := range []bool{true, false} {
		t.Run(fmt.Sprintf("heartbeat=%v", heartbeat), func(t *testing.T) {
			t.Parallel()
			q := newQueue(t, queueOptions{})
			db := newDatabase(t)
			cfg := sourceConfig(t, q)
			cfg.VisibilityTimeout = 2 * time.Second
			cfg.HeartbeatInterval = 500 * time.Millisecond
			if !heartbeat {
				cfg.HeartbeatInterval = -1
			}
			const handlerTime = 5 * time.Second // 2.5 visibility timeouts

			var running atomic.Int32
			var calls atomic.Int64
			handler := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
				calls.Add(1)
				running.Add(1)
				defer running.Add(-1)
				if err := recordEffect("slow")(ctx, tx, msg); err != nil {
					return err
				}
				select {
				case <-time.After(handlerTime):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			var srcs []*watchedSource
			var runners []*runner
			for range 2 {
				src := &watchedSource{Source: newSource(t, cfg), running: &running}
				srcs = append(srcs, src)
				runners = append(runners, startRunner(t, src, consumer.Transactional(db.Store, handler),
					consumer.Config{Name: "slow", Concurrency: 2, Retry: fastRetry}))
			}
			publish(t, q.URL, false, outMsg{Key: "slow-1", Body: `{"slow":true}`})

			runtest.WaitFor(t, 40*time.Second, func() string {
				return fmt.Sprintf("handler calls %d, queue depth %d", calls.Load(), queueDepth(t, q.URL))
			}, func() bool { return calls.Load() > 0 && running.Load() == 0 && queueDepth(t, q.URL) == 0 })
			for _, r := range runners {
				r.stop()
			}

			var received, concurrent int64
			var duplicates uint64
			for i, s := range srcs {
				received += s.received.Load()
				concurrent += s.concurrent.Load()
				duplicates += runners[i].Stats().Duplicates
			}
			rows, _ := effectCounts(t, db)
			t.Logf("received %d (during a handler: %d), handler calls %d, duplicates %d, effect rows %d",
				received, concurrent, calls.Load(), duplicates, rows)
			if calls.Load() != 1 || rows != 1 {
				t.Fatalf("handler ran %d times and left %d effect rows, want 1 and 1", calls.Load(), rows)
			}
			if heartbeat {
				if received != 1 {
					t.Fatalf("with the heartbeat the message was received %d times, want 1", received)
				}
				return
			}
			if concurrent < 1 || duplicates < 1 {
				t.Fatalf("without the heartbeat the message was received %d times while the handler ran and deduplicated %d times; want both at least 1",
					concurrent, duplicates)
			}
		})
	}
}

// lostDeleteSource simulates a crash between commit and delete: Ack reports
// success but deletes nothing, for the messages drop selects, on their first
// delivery only.
type lostDeleteSource struct {
	consumer.Source
	drop func(*consumer.Message) bool
	// visibleAfter is when a lost message comes back; 0 means it stays in
	// flight until the source is closed (as after a crash), otherwise it
	// is handed back with Retry (as after a delete lost in the network).
	visibleAfter time.Duration
	lost         atomic.Int64
}

func (l *lostDeleteSource) Ack(ctx context.Context, msgs []*consumer.Message) error {
	var keep []*consumer.Message
	for _, m := range msgs {
		if m.Attempt > 1 || !l.drop(m) {
			keep = append(keep, m)
			continue
		}
		l.lost.Add(1)
		if l.visibleAfter > 0 {
			if err := l.Source.Retry(ctx, m, l.visibleAfter); err != nil {
				return err
			}
		}
	}
	if len(keep) == 0 {
		return nil
	}
	return l.Source.Ack(ctx, keep)
}

// TestCrashAfterCommitBeforeAck commits every message but loses every
// delete, as a worker that dies right after its commits; the next worker
// deletes every redelivery without running the handler again.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	const n = 30
	q := newQueue(t, queueOptions{})
	db := newDatabase(t)
	publish(t, q.URL, false, numbered("crash", n)...)
	var calls atomic.Int64
	handler := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		calls.Add(1)
		return recordEffect("w")(ctx, tx, msg)
	}
	path := consumer.Transactional(db.Store, handler)
	cfg := consumer.Config{Name: "crash", BatchSize: 5, Concurrency: 2, Retry: fastRetry}

	first := &lostDeleteSource{Source: newSource(t, sourceConfig(t, q)), drop: func(*consumer.Message) bool { return true }}
	r1 := startRunner(t, first, path, cfg)
	runtest.WaitFor(t, 30*time.Second, func() string { return fmt.Sprintf("%d of %d handled", calls.Load(), n) },
		func() bool { return calls.Load() >= n })
	r1.stop()
	if err := first.Close(); err != nil { // releases the undeleted messages
		t.Fatal(err)
	}
	if got := first.lost.Load(); got != n {
		t.Fatalf("lost %d deletes, want %d", got, n)
	}

	second := newSource(t, sourceConfig(t, q))
	r2 := startRunner(t, second, path, cfg)
	runtest.WaitFor(t, 30*time.Second, func() string { return fmt.Sprintf("queue depth %d", queueDepth(t, q.URL)) },
		func() bool { return queueDepth(t, q.URL) == 0 })
	r2.stop()

	rows, keys := effectCounts(t, db)
	st := r2.Stats()
	if calls.Load() != n || rows != n || keys != n {
		t.Fatalf("handler calls %d, effect rows %d (%d keys), want %d each", calls.Load(), rows, keys, n)
	}
	if st.Duplicates != n || st.Handled != 0 {
		t.Fatalf("second worker stats %+v, want %d duplicates and nothing handled", st, n)
	}
}

// fifoEvent is the body of the FIFO test's messages.
type fifoEvent struct {
	Group string `json:"group"`
	Seq   int    `json:"seq"`
}

// TestFIFOOrderAndDuplicates checks that a runner over a FIFO queue applies
// every group's messages in order, once, while producer duplicates (same key,
// new MessageDeduplicationId) and redeliveries after lost deletes arrive.
func TestFIFOOrderAndDuplicates(t *testing.T) {
	t.Parallel()
	const groups, perGroup = 3, 12
	q := newQueue(t, queueOptions{FIFO: true})
	db := newDatabase(t)

	var out []outMsg
	for s := range perGroup {
		for g := range groups {
			group := fmt.Sprintf("g%d", g)
			out = append(out, outMsg{
				Key:   fmt.Sprintf("%s-%02d", group, s),
				Body:  fmt.Sprintf(`{"group":%q,"seq":%d}`, group, s),
				Group: group,
			})
		}
	}
	// A producer retry beyond SQS's deduplication interval: same key and
	// payload, new MessageDeduplicationId, so SQS delivers it again.
	dup := out[0]
	dup.DedupID = "producer-retry"
	out = append(out, dup)
	publish(t, q.URL, true, out...)

	handler := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message, e fifoEvent) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, grp, n) VALUES ($1, $2, $3)`, msg.Key, e.Group, e.Seq)
		return err
	})
	src := &lostDeleteSource{
		Source:       newSource(t, sourceConfig(t, q)),
		drop:         func(m *consumer.Message) bool { return strings.HasSuffix(m.Key, "3") || strings.HasSuffix(m.Key, "7") },
		visibleAfter: time.Second,
	}
	r := startRunner(t, src, consumer.Transactional(db.Store, handler),
		consumer.Config{Name: "fifo", Concurrency: 3, BatchSize: 4, Retry: fastRetry})
	runtest.WaitFor(t, 60*time.Second, func() string {
		rows, _ := effectCounts(t, db)
		return fmt.Sprintf("%d effect rows, queue depth %d", rows, queueDepth(t, q.URL))
	}, func() bool {
		rows, _ := effectCounts(t, db)
		return rows >= groups*perGroup && queueDepth(t, q.URL) == 0
	})
	r.stop()

	rows, keys := effectCounts(t, db)
	if rows != groups*perGroup || keys != rows {
		t.Fatalf("%d effect rows for %d keys, want %d each", rows, keys, groups*perGroup)
	}
	ctx := testContext(t, 10*time.Second)
	for g := range groups {
		group := fmt.Sprintf("g%d", g)
		var seqs []int
		r, err := db.Pool.Query(ctx, `SELECT n FROM effects WHERE grp = $1 ORDER BY id`, group)
		if err != nil {
			t.Fatal(err)
		}
		seqs, err = pgx.CollectRows(r, pgx.RowTo[int])
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range seqs {
			if s != i {
				t.Fatalf("group %s applied in order %v, want 0..%d", group, seqs, perGroup-1)
			}
		}
	}
	st := r.Stats()
	if want := uint64(src.lost.Load()) + 1; st.Duplicates != want {
		t.Fatalf("stats %+v: %d duplicates, want %d (lost deletes + the producer retry)", st, st.Duplicates, want)
	}
}

// TestPoisonIsDeadLettered sends a malformed message and one whose handler
// always fails among good ones: both land in the dead-letter queue with their
// reason and attempt count, and the rest of the queue is applied.
func TestPoisonIsDeadLettered(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	db := newDatabase(t)
	msgs := numbered("poison", 20)
	msgs[5].Body = "not json"
	msgs[11].Body = `{"key":"poison-011","fail":true}`
	publish(t, q.URL, false, msgs...)

	type body struct {
		Fail bool `json:"fail"`
	}
	handler := consumer.TxJSON(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message, b body) error {
		if b.Fail {
			return errors.New("downstream refused")
		}
		return recordEffect("w")(ctx, tx, msg)
	})
	src := newSource(t, sourceConfig(t, q))
	r := startRunner(t, src, consumer.Transactional(db.Store, handler),
		consumer.Config{Name: "poison", Concurrency: 2, BatchSize: 5, Retry: fastRetry})

	dead := drain(t, q.DLQURL, 2, 40*time.Second)
	runtest.WaitFor(t, 30*time.Second, func() string { return fmt.Sprintf("queue depth %d", queueDepth(t, q.URL)) },
		func() bool { return queueDepth(t, q.URL) == 0 })
	r.stop()

	if len(dead) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dead))
	}
	want := map[string]struct {
		reason   string
		attempts int
	}{
		"poison-005": {"malformed", 1},
		"poison-011": {"retries exhausted", fastRetry.MaxAttempts},
	}
	for _, m := range dead {
		attr := func(name string) string { return aws.ToString(m.MessageAttributes[name].StringValue) }
		key := attr(keyAttribute)
		w, ok := want[key]
		if !ok {
			t.Fatalf("unexpected dead letter %q", key)
		}
		attempts, _ := strconv.Atoi(attr(consumer.MetaAttempts))
		if !strings.Contains(attr(consumer.MetaReason), w.reason) || attempts != w.attempts ||
			attr(sqssource.MetaOriginMessageID) == "" || attr(sqssource.MetaOriginQueue) != q.URL {
			t.Errorf("dead letter %s: reason %q, attempts %d, id %q, source %q; want reason with %q, %d attempts",
				key, attr(consumer.MetaReason), attempts, attr(sqssource.MetaOriginMessageID), attr(sqssource.MetaOriginQueue), w.reason, w.attempts)
		}
	}
	rows, keys := effectCounts(t, db)
	if rows != 18 || keys != 18 {
		t.Fatalf("%d effect rows (%d keys), want 18", rows, keys)
	}
}

// TestRedrivePolicyDeadLetters leaves dead-lettering to the queue's redrive
// policy: the poison message reaches the policy's dead-letter queue after
// maxReceiveCount receives, and the rest flows.
func TestRedrivePolicyDeadLetters(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{MaxReceiveCount: 2})
	db := newDatabase(t)
	msgs := numbered("redrive", 6)
	msgs[2].Body = "poison"
	publish(t, q.URL, false, msgs...)

	var poisonCalls atomic.Int64
	handler := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		if string(msg.Body) == "poison" {
			poisonCalls.Add(1)
			return consumer.Permanent(errors.New("cannot handle poison"))
		}
		return recordEffect("w")(ctx, tx, msg)
	}
	cfg := sourceConfig(t, q)
	cfg.DeadLetterQueueURL = ""
	cfg.RedriveDelay = time.Second
	src := newSource(t, cfg)
	retry := fastRetry
	retry.MaxAttempts = src.MaxReceiveCount()
	r := startRunner(t, src, consumer.Transactional(db.Store, handler),
		consumer.Config{Name: "redrive", Concurrency: 2, Retry: retry})

	dead := drain(t, q.DLQURL, 1, 40*time.Second)
	runtest.WaitFor(t, 30*time.Second, func() string { return fmt.Sprintf("queue depth %d", queueDepth(t, q.URL)) },
		func() bool { return queueDepth(t, q.URL) == 0 })
	r.stop()

	if len(dead) != 1 || aws.ToString(dead[0].Body) != "poison" {
		t.Fatalf("dead letters %v, want the poison message", dead)
	}
	if got := poisonCalls.Load(); got != 2 {
		t.Errorf("poison handled %d times, want maxReceiveCount = 2", got)
	}
	rows, _ := effectCounts(t, db)
	if rows != 5 {
		t.Fatalf("%d effect rows, want 5", rows)
	}
}
