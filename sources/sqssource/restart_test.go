package sqssource_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sqssource"
)

// With the configuration docs/guarantees.md names (queue, dead-letter queue and key
// attribute; everything else at its default), an SQS restart in the middle
// of a run loses nothing and applies nothing twice. The server keeps its
// messages across the restart, as SQS does (testenv.DurableSQS); every third
// message fails its first attempt and waits 1 to 5 s in the queue
// (ChangeMessageVisibility), and the restart comes once a third of the
// messages were handled, so it hits receives, deletes, retry delays and
// messages in flight. Messages in flight at the restart come back after the
// default 30 s visibility timeout, and the dedup records absorb those whose
// effect had committed.
func TestDefaultConfigSurvivesBrokerRestart(t *testing.T) {
	t.Parallel()
	needServices(t)
	server := testenv.StartDurableSQS(t)
	c, err := newClient(server.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t, 30*time.Second)
	name := runtest.UniqueName(t, "")
	dlq := createQueue(ctx, t, c, name+"-dlq", nil)
	queue := createQueue(ctx, t, c, name, nil)
	const n = 600
	publishWith(t, c, queue, false, numbered("restart", n)...)

	db := newDatabase(t)
	src, err := sqssource.New(ctx, c, sqssource.Config{
		QueueURL:           queue,
		DeadLetterQueueURL: dlq,
		KeyAttribute:       keyAttribute,
		Logger:             runtest.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	delays := []time.Duration{time.Second, 2 * time.Second, 5 * time.Second}
	var mu sync.Mutex
	tried := map[string]int{}
	effect := recordEffect("restart")
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		tried[m.Key]++
		i := len(tried)
		first := tried[m.Key] == 1
		mu.Unlock()
		if first && i%3 == 0 {
			return consumer.RetryAfter(delays[i%len(delays)], errors.New("first attempt fails"))
		}
		return effect(ctx, tx, m)
	}
	r := startRunner(t, src, consumer.Transactional(db.Store, handler), consumer.Config{Name: "restart"})

	runtest.WaitFor(t, time.Minute, func() string { return "a third of the messages handled" },
		func() bool { return r.Stats().Handled >= n/3 })
	before := r.Stats()
	server.Restart(t)
	t.Logf("restarted the SQS server; runner before: %+v", before)

	// In-flight messages return after the 30 s visibility timeout.
	runtest.WaitFor(t, 2*time.Minute, func() string {
		rows, keys := effectCounts(t, db)
		return fmt.Sprintf("every message handled: %d keys in %d effect rows", keys, rows)
	}, func() bool {
		_, keys := effectCounts(t, db)
		return keys == n
	})
	r.stop()
	t.Logf("runner after: %+v; source %+v", r.Stats(), src.Stats())
	if rows, keys := effectCounts(t, db); rows != n || keys != n {
		t.Fatalf("%d effect rows for %d keys, want %d each: a message applied twice", rows, keys, n)
	}
	if d := queueDepthWith(t, c, dlq); d != 0 {
		t.Fatalf("%d dead letters, want none", d)
	}
}
