package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
)

// conflictScript plays the database of handlers that update hot rows
// without a partition key: a handler fails with a deadlock (SQLSTATE 40P01)
// when its message is hot and another hot message already ran in the same
// transaction, as two lanes locking the same rows in crossing orders do.
// again, if set, makes a hot key deadlock also on its own, on its calls 2
// to 1+again[key]. It records the keys each transaction ran, in order.
type conflictScript struct {
	hot   map[string]bool
	again map[string]int

	mu        sync.Mutex
	txs       [][]string      // keys run per transaction, in order of the transactions
	txIndex   map[pgx.Tx]int  // index in txs
	hotIn     map[pgx.Tx]bool // a hot message ran in the transaction
	calls     map[string]int  // handler calls per key
	deadlocks int             // deadlocks returned
	// before, if set, is called first by every handler call, with the keys
	// that ran before it in the same transaction.
	before func(key string, earlier []string)
}

func newConflictScript(hot ...string) *conflictScript {
	s := &conflictScript{hot: map[string]bool{}, again: map[string]int{}, txIndex: map[pgx.Tx]int{}, hotIn: map[pgx.Tx]bool{}, calls: map[string]int{}}
	for _, k := range hot {
		s.hot[k] = true
	}
	return s
}

// handler wraps the fixture's handler (one effect row per call) with the
// script.
func (s *conflictScript) handler(f *fixture) consumer.TxHandler[pgx.Tx] {
	inner := f.handler(nil)
	return func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		s.mu.Lock()
		i, ok := s.txIndex[tx]
		if !ok {
			i = len(s.txs)
			s.txIndex[tx] = i
			s.txs = append(s.txs, nil)
		}
		earlier := slices.Clone(s.txs[i])
		s.txs[i] = append(s.txs[i], msg.Key)
		s.calls[msg.Key]++
		call := s.calls[msg.Key]
		deadlock := s.hot[msg.Key] && (s.hotIn[tx] || (call > 1 && call <= 1+s.again[msg.Key]))
		if s.hot[msg.Key] {
			s.hotIn[tx] = true
		}
		if deadlock {
			s.deadlocks++
		}
		s.mu.Unlock()
		if s.before != nil {
			s.before(msg.Key, earlier)
		}
		if err := inner(ctx, tx, msg); err != nil {
			return err
		}
		if deadlock {
			return fmt.Errorf("update accounts: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
		}
		return nil
	}
}

// settledOrRetried waits until every message settled, or until one was
// handed back to the broker or dead-lettered (which these tests must not
// see), so that such a failure shows at once.
func (f *fixture) settledOrRetried() memsource.TopicStats {
	f.t.Helper()
	return f.waitFor("every message settled, or a retry", func(st memsource.TopicStats) bool {
		return (st.Ready == 0 && st.InFlight == 0 && st.Pending == 0) || st.Retries > 0 || st.DeadLettered > 0
	})
}

func (s *conflictScript) deadlockCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadlocks
}

func (s *conflictScript) transactions() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.txs)
}

// A batch that deadlocks with another transaction is rerun one message per
// transaction, not at full size again (where its hot messages would meet
// and deadlock again), without handing a message back to the broker and
// without counting an attempt (MaxAttempts 1 would dead-letter it). The next
// batch runs at full size again.
func TestLockConflictRerunsOneMessagePerTransaction(t *testing.T) {
	f := newFixture(t)
	f.visibility(10 * time.Second) // no redelivery on a loaded machine
	script := newConflictScript("d002", "d005", "d008")
	first := keys(10, "d")
	f.publish(first...)
	for _, k := range first {
		f.maxCalls(k, 2) // the failed batch, then its own transaction
	}
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, script.handler(f)),
		consumer.Config{Concurrency: 1, BatchSize: 10, BatchWait: 2 * time.Second, Retry: quickRetry(1)})
	st := f.settledOrRetried()
	if n := script.deadlockCount(); n != 1 {
		t.Fatalf("%d deadlocks, want 1: the rerun put hot messages in one transaction again (transactions %v)", n, script.transactions())
	}
	if st.Retries != 0 || st.DeadLettered != 0 {
		t.Fatalf("broker retries %d, dead letters %d (%+v), want none: a deadlock is rerun in place",
			st.Retries, st.DeadLettered, f.broker.DeadLetters(f.topic))
	}
	txs := script.transactions()
	if len(txs) < 2 || len(txs[0]) < 2 {
		t.Fatalf("transactions %v: want a batch that deadlocked first", txs)
	}
	for _, tx := range txs[1:] {
		if len(tx) != 1 {
			t.Fatalf("transactions %v: the rerun after the deadlock ran %v together, want one message per transaction", txs, tx)
		}
	}

	// The next batch is a fresh one: full size again.
	second := keys(10, "e")
	f.publish(second...)
	f.settled()
	r.stop()
	f.requireOnce(append(first, second...)...)
	after := script.transactions()[len(txs):]
	if len(after) != 1 || len(after[0]) != len(second) {
		t.Fatalf("transactions of the next batch %v, want all %d messages in one", after, len(second))
	}
}

// Partition order holds while a deadlocked batch is rerun one message per
// transaction: when a message deadlocks again on its own and is handed back
// (without counting an attempt), the later messages of its partition wait
// behind it instead of committing ahead of it.
func TestLockConflictRerunHoldsPartitionOrder(t *testing.T) {
	f := newFixture(t)
	f.visibility(10 * time.Second)
	script := newConflictScript("p0", "q0")
	script.again["p0"] = 1 // deadlocks again on its own, once
	var (
		mu         sync.Mutex
		overtaken  []string
		inspectErr error
	)
	script.before = func(key string, earlier []string) {
		if (key != "p1" && key != "p2") || slices.Contains(earlier, "p0") {
			return
		}
		// p0 must be committed before a later message of its partition
		// runs, or run before it in the same transaction.
		_, err := f.store.Inspect(context.Background(), "test", "p0")
		mu.Lock()
		defer mu.Unlock()
		switch {
		case errors.Is(err, dedup.ErrNotFound):
			overtaken = append(overtaken, key)
		case err != nil:
			inspectErr = err
		}
	}
	for _, m := range []struct{ key, pk string }{{"p0", "A"}, {"x0", ""}, {"q0", "B"}, {"p1", "A"}, {"x1", ""}, {"p2", "A"}} {
		f.broker.Publish(f.topic, memsource.Outgoing{Key: m.key, Body: []byte("body-" + m.key), PartitionKey: m.pk})
	}
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, script.handler(f)),
		consumer.Config{Concurrency: 1, BatchSize: 6, BatchWait: 2 * time.Second, Retry: quickRetry(1)})
	st := f.settled()
	r.stop()
	mu.Lock()
	defer mu.Unlock()
	if inspectErr != nil {
		t.Fatal(inspectErr)
	}
	if len(overtaken) > 0 {
		t.Fatalf("%v ran before p0, the earlier message of their partition, committed (transactions %v)", overtaken, script.transactions())
	}
	if st.DeadLettered != 0 {
		t.Fatalf("dead letters %+v: a deadlock is never a counted attempt", f.broker.DeadLetters(f.topic))
	}
	f.requireOnce("p0", "x0", "q0", "p1", "x1", "p2")
}
