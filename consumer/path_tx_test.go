package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// quickRetry is a retry policy for tests: maxAttempts attempts, short backoff.
func quickRetry(maxAttempts int) consumer.RetryPolicy {
	return consumer.RetryPolicy{MaxAttempts: maxAttempts, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
}

// A handler's own failure is a counted attempt, whatever its type: its
// deadline, a failed HTTP call, a DNS failure, a truncated body. Only the
// store's typed database errors are infrastructure.
func TestHandlerErrorsAreCountedAttempts(t *testing.T) {
	for name, hErr := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"deadline": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT pg_sleep(10)`)
			return err
		},
		"url error": func(context.Context, pgx.Tx) error {
			return &url.Error{Op: "Post", URL: "http://127.0.0.1:1/hook", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}
		},
		"dns error": func(context.Context, pgx.Tx) error {
			return fmt.Errorf("lookup: %w", &net.DNSError{Err: "timeout", Name: "example.invalid", IsTimeout: true})
		},
		"unexpected EOF": func(context.Context, pgx.Tx) error {
			return fmt.Errorf("decode: %w", io.ErrUnexpectedEOF)
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			// A retry that comes after the visibility timeout (a loaded
			// machine) would be a redelivery, not an attempt of this test.
			f.visibility(10 * time.Second)
			f.publish("k")
			h := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
				if err := f.handler(nil)(ctx, tx, msg); err != nil {
					return err
				}
				return hErr(ctx, tx)
			}
			f.maxCalls("k", 2)
			r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, h),
				consumer.Config{HandlerTimeout: 100 * time.Millisecond, Retry: quickRetry(2)})
			f.settled()
			r.stop()
			dl := f.broker.DeadLetters(f.topic)
			if len(dl) != 1 || !errors.Is(dl[0].Err, consumer.ErrMaxAttempts) {
				t.Fatalf("dead letters = %+v, want k after its attempts", dl)
			}
			if f.calls("k") != 2 {
				t.Fatalf("handler ran %d times, want 2 (MaxAttempts)", f.calls("k"))
			}
			f.requireOnce()
			if _, err := f.store.Inspect(context.Background(), "test", "k"); !errors.Is(err, dedup.ErrNotFound) {
				t.Fatalf("record of the failed key: %v, want ErrNotFound", err)
			}
		})
	}
}

// Permanent wins over any classification: dead-lettered after one call.
func TestPermanentWinsOverTransient(t *testing.T) {
	for name, err := range map[string]error{
		"dns error":   &net.DNSError{Err: "timeout", Name: "example.invalid", IsTimeout: true},
		"deadlock":    &pgconn.PgError{Code: "40P01", Message: "deadlock detected"},
		"lost server": &pgconn.PgError{Code: "57P01", Message: "terminating connection"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.publish("k")
			h := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
				f.mu.Lock()
				f.runs["k"]++
				f.mu.Unlock()
				return consumer.Permanent(err)
			}
			r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, h), consumer.Config{Retry: quickRetry(5)})
			f.settled()
			r.stop()
			dl := f.broker.DeadLetters(f.topic)
			if len(dl) != 1 || f.calls("k") != 1 {
				t.Fatalf("%d calls, dead letters %+v: want 1 call and 1 dead letter", f.calls("k"), dl)
			}
		})
	}
}

// A handler's serialization failure or deadlock is the database's, not the
// message's: retried without counting, never dead-lettered.
func TestHandlerSerializationFailureIsNotCounted(t *testing.T) {
	for _, code := range []string{"40001", "40P01"} {
		t.Run(code, func(t *testing.T) {
			f := newFixture(t)
			f.publish("busy")
			fail := func(msg *consumer.Message, call int) error {
				if call <= 4 {
					return fmt.Errorf("update: %w", &pgconn.PgError{Code: code, Message: "could not serialize"})
				}
				return nil
			}
			r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(fail)), consumer.Config{Retry: quickRetry(2)})
			f.settled()
			r.stop()
			f.requireOnce("busy")
			if dl := f.broker.DeadLetters(f.topic); len(dl) != 0 || f.calls("busy") != 5 {
				t.Fatalf("%d calls, dead letters %+v: want 5 calls, none dead-lettered", f.calls("busy"), dl)
			}
		})
	}
}

// statementSpy is a pgx tracer that records every statement starting with
// one of its prefixes (upper case).
type statementSpy struct {
	prefixes []string
	mu       sync.Mutex
	sql      []string
}

// savepointSpy records the statements naming a savepoint.
func savepointSpy() *statementSpy {
	return &statementSpy{prefixes: []string{"SAVEPOINT", "RELEASE", "ROLLBACK TO"}}
}

func (s *statementSpy) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.saw(d.SQL)
	return ctx
}

func (s *statementSpy) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statementSpy) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		s.saw(q.SQL)
	}
	return ctx
}

func (s *statementSpy) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (s *statementSpy) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (s *statementSpy) saw(sql string) {
	for _, stmt := range strings.Split(strings.ToUpper(sql), ";") {
		stmt = strings.TrimSpace(stmt)
		if !slices.ContainsFunc(s.prefixes, func(p string) bool { return strings.HasPrefix(stmt, p) }) {
			continue
		}
		s.mu.Lock()
		s.sql = append(s.sql, sql)
		s.mu.Unlock()
	}
}

// count returns how many statements the spy recorded.
func (s *statementSpy) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sql)
}

// spiedStore is the fixture's store over a pool whose statements spy sees.
func spiedStore(t *testing.T, f *fixture, spy *statementSpy) *pgdedup.Store {
	t.Helper()
	cfg := f.pool.Config().Copy()
	cfg.ConnConfig.Tracer = spy
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	store, err := pgdedup.New(pool, f.store.Config())
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// A failing handler in a savepoint-free batch leaves none of its writes and
// none of its record committed, while the rest of the batch commits.
func TestSavepointFreeBatchDropsOnlyTheFailure(t *testing.T) {
	f := newFixture(t)
	spy := savepointSpy()
	store := spiedStore(t, f, spy)
	ks := keys(10, "b")
	f.publish(ks...)
	fail := func(msg *consumer.Message, call int) error {
		if msg.Key == "b004" {
			return errors.New("always fails, after its write")
		}
		return nil
	}
	f.maxCalls("b004", 1)
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(store, f.handler(fail)),
		consumer.Config{Concurrency: 1, BatchSize: 10, Retry: quickRetry(1)})
	f.settled()
	r.stop()
	ok := slices.DeleteFunc(slices.Clone(ks), func(k string) bool { return k == "b004" })
	f.requireOnce(ok...)
	for _, k := range ok {
		if _, err := f.store.Inspect(context.Background(), "test", k); err != nil {
			t.Errorf("record of %s: %v", k, err)
		}
	}
	if _, err := f.store.Inspect(context.Background(), "test", "b004"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("record of the failed key: %v, want ErrNotFound", err)
	}
	dl := f.broker.DeadLetters(f.topic)
	if len(dl) != 1 || dl[0].Key != "b004" || f.calls("b004") != 1 {
		t.Fatalf("dead letters %+v after %d calls, want b004 alone after 1 call", dl, f.calls("b004"))
	}
	if spy.count() > 0 {
		t.Fatalf("the batch used savepoints: %q", spy.sql)
	}
}

// A handler that swallows its statement's error leaves the transaction
// aborted: the next message's statement fails with 25P02. That message is
// not the culprit: with MaxAttempts 1, any attempt counted against an
// innocent message would dead-letter it.
//
// With pgdedup the runner sees the failed transaction as soon as the culprit
// returns; through a store that cannot tell (blind), it halves the suspects.
func TestSwallowedErrorBlamesOnlyTheCulprit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pos   int
		blind bool
	}{{"status", 0, false}, {"status", 3, false}, {"status", 6, false}, {"blind", 0, true}, {"blind", 3, true}, {"blind", 6, true}} {
		pos := tc.pos
		t.Run(fmt.Sprint(tc.name, " culprit at ", pos), func(t *testing.T) {
			f := newFixture(t)
			var store dedupdriver.TxStore[pgx.Tx] = f.store
			if tc.blind {
				store = blindStore{f.store.Driver()}
			}
			ks := keys(7, "s")
			poison := ks[pos]
			f.publish(ks...)
			h := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
				if msg.Key == poison {
					f.mu.Lock()
					f.runs[poison]++
					f.mu.Unlock()
					_, _ = tx.Exec(ctx, `SELECT 1/$1::int`, 0) // error swallowed: the transaction is aborted
					return nil
				}
				return f.handler(nil)(ctx, tx, msg)
			}
			r := f.start(f.broker.Source(f.topic), consumer.Transactional(store, h),
				consumer.Config{Concurrency: 1, BatchSize: 7, Retry: quickRetry(1)})
			f.settled()
			r.stop()
			innocent := slices.DeleteFunc(slices.Clone(ks), func(k string) bool { return k == poison })
			f.requireOnce(innocent...)
			dl := f.broker.DeadLetters(f.topic)
			if len(dl) != 1 || dl[0].Key != poison {
				t.Fatalf("dead letters = %+v, want only %s", dl, poison)
			}
		})
	}
}

// A failed message holds the later messages of its partition in its batch:
// they are not committed ahead of it, and are released without counting an
// attempt. The earlier ones commit in the rerun.
func TestFailedMessageHoldsItsPartitionUncounted(t *testing.T) {
	f := newFixture(t)
	for i := range 6 {
		pk := "acct-1"
		if i%2 == 1 {
			pk = "acct-2"
		}
		f.broker.Publish(f.topic, memsource.Outgoing{Key: fmt.Sprintf("p%d", i), Body: []byte(fmt.Sprint(i)), PartitionKey: pk})
	}
	fail := func(msg *consumer.Message, call int) error {
		if msg.Key == "p2" && call == 1 {
			return errors.New("fails once")
		}
		return nil
	}
	// MaxAttempts 2: p2 fails once and is retried; a counted attempt
	// against p4 (held behind it) would be harmless here, so check the
	// order and that p4 ran only after p2 committed. BatchWait makes the
	// six one batch (a lane starts with what is queued, which under the
	// race detector was sometimes four of them; the hold covers one batch).
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(fail)),
		consumer.Config{Concurrency: 1, BatchSize: 6, BatchWait: 500 * time.Millisecond, Retry: quickRetry(2)})
	f.settled()
	r.stop()
	f.requireOnce("p0", "p1", "p2", "p3", "p4", "p5")
	rows, err := f.pool.Query(context.Background(), `SELECT body FROM `+f.table+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	bodies, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if i2, i4 := slices.Index(bodies, "2"), slices.Index(bodies, "4"); i4 < i2 {
		t.Fatalf("committed in order %v: p4 overtook p2 of the same partition", bodies)
	}
	if got := bodies[:min(4, len(bodies))]; !slices.Equal(got, []string{"0", "1", "3", "5"}) {
		t.Fatalf("committed in order %v: the rerun without p2 and p4 should commit p0, p1, p3 and p5 first", bodies)
	}
	if f.calls("p4") != 1 {
		t.Fatalf("p4 ran %d times: held behind p2, it must not run before p2 succeeds", f.calls("p4"))
	}
	if dl := f.broker.DeadLetters(f.topic); len(dl) != 0 {
		t.Fatalf("dead letters = %+v", dl)
	}
}

// A batch handler that names the failing message with a *MessageError gets
// the batch again without it, and that message alone is retried: the
// error's type decides "this message" rather than "all of them". Its
// batch-mates run twice (the failed call and the rerun), not once per
// bisection round, and only the named message is counted and dead-lettered.
func TestBatchMessageErrorRerunsWithoutTheNamedMessage(t *testing.T) {
	f := newFixture(t)
	// A broker of the test's own, whose deliveries do not expire under load.
	broker := memBroker(t, memsource.Config{VisibilityTimeout: time.Minute, Seed: 1})
	const topic, culprit = "named", "n003"
	ks := keys(8, "n")
	for _, k := range ks {
		broker.Publish(topic, memsource.Outgoing{Key: k, Body: []byte("x")})
	}
	var mu sync.Mutex
	calls := map[string]int{}
	h := func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			calls[m.Key]++
		}
		for _, m := range msgs {
			if m.Key == culprit {
				return &consumer.MessageError{Msg: m, Err: errors.New("downstream refused " + culprit)}
			}
		}
		return nil
	}
	overRun := func() string {
		mu.Lock()
		defer mu.Unlock()
		for k, n := range calls {
			if n > 2 {
				return fmt.Sprintf("handler ran %d times for %s, want at most 2 (calls %v)", n, k, calls)
			}
		}
		return ""
	}
	r := f.start(broker.Source(topic), consumer.TransactionalBatch(f.store, h),
		consumer.Config{Concurrency: 1, BatchSize: len(ks), Retry: quickRetry(2)})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if bad := overRun(); bad != "" {
			t.Fatal(bad)
		}
		st := broker.Stats(topic)
		if st.Acks == uint64(len(ks)-1) && st.DeadLettered == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled within 10 s: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.stop()
	dl := broker.DeadLetters(topic)
	if len(dl) != 1 || dl[0].Key != culprit || dl[0].Attempts != 2 {
		t.Fatalf("dead letters %+v, want %s alone after 2 attempts", dl, culprit)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls[culprit] != 2 {
		t.Fatalf("handler ran %d times for %s, want 2 (MaxAttempts)", calls[culprit], culprit)
	}
	for _, k := range ks {
		_, err := f.store.Inspect(context.Background(), "test", k)
		if k == culprit && !errors.Is(err, dedup.ErrNotFound) || k != culprit && err != nil {
			t.Fatalf("record of %s: %v", k, err)
		}
	}
}

// The batch API gets only new messages, commits their set-based writes with
// their records, and finds a culprit that its error does not name by
// halving the batch, without counting an attempt against the others.
func TestTransactionalBatchFindsCulprit(t *testing.T) {
	f := newFixture(t)
	accounts := strings.Replace(f.table, `"effects"`, `"accounts"`, 1)
	f.exec(`CREATE TABLE ` + accounts + ` (id int PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))`)
	f.exec(`INSERT INTO ` + accounts + ` SELECT generate_series(0, 9), 0`)
	type op struct {
		Account int32 `json:"account"`
		Amount  int64 `json:"amount"`
	}
	var want int64
	for i := range 30 {
		amount := int64(1)
		if i == 17 {
			amount = -1000 // breaks the CHECK: the UPDATE fails for the whole batch
		} else {
			want += amount
		}
		f.broker.Publish(f.topic, memsource.Outgoing{Key: fmt.Sprintf("m%02d", i), Body: fmt.Appendf(nil, `{"account":%d,"amount":%d}`, i%10, amount)})
	}
	f.broker.Publish(f.topic, memsource.Outgoing{Key: "bad", Body: []byte(`{not json`)})
	var mu sync.Mutex
	seen := map[string]int{}
	h := consumer.TxBatchJSON(func(ctx context.Context, tx pgx.Tx, items []consumer.BatchItem[op]) error {
		ids, amounts := make([]int32, len(items)), make([]int64, len(items))
		mu.Lock()
		for i, it := range items {
			ids[i], amounts[i] = it.Value.Account, it.Value.Amount
			seen[it.Msg.Key]++
		}
		mu.Unlock()
		_, err := tx.Exec(ctx, `UPDATE `+accounts+` a SET balance = a.balance + u.amount
			FROM (SELECT id, sum(amount) AS amount FROM unnest($1::int[], $2::bigint[]) AS u(id, amount) GROUP BY id) u
			WHERE a.id = u.id`, ids, amounts)
		return err
	})
	r := f.start(f.broker.Source(f.topic), consumer.TransactionalBatch(f.store, h),
		consumer.Config{Concurrency: 1, BatchSize: 100, Retry: quickRetry(1)})
	f.settled()
	var total int64
	if err := f.pool.QueryRow(context.Background(), `SELECT sum(balance) FROM `+accounts).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != want {
		t.Fatalf("sum of balances %d, want %d", total, want)
	}
	dl := f.broker.DeadLetters(f.topic)
	keys := []string{}
	for _, d := range dl {
		keys = append(keys, d.Key)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"bad", "m17"}) {
		t.Fatalf("dead letters %v, want bad and m17 only", keys)
	}
	if _, err := f.store.Inspect(context.Background(), "test", "m17"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("record of the culprit: %v, want ErrNotFound", err)
	}

	// Redelivered, every key is a duplicate: the handler is not called.
	// Duplicates are counted from here on: if the first phase stayed in
	// flight past the broker's visibility timeout (a loaded machine), its
	// messages were redelivered and acknowledged as duplicates already.
	dupsBefore := r.Stats().Duplicates
	before := len(seen)
	calls := 0
	for _, n := range seen {
		calls += n
	}
	for i := range 30 {
		if i != 17 {
			f.broker.Publish(f.topic, memsource.Outgoing{Key: fmt.Sprintf("m%02d", i), Body: fmt.Appendf(nil, `{"account":%d,"amount":%d}`, i%10, 1)})
		}
	}
	f.settled()
	r.stop()
	after := 0
	for _, n := range seen {
		after += n
	}
	if len(seen) != before || after != calls {
		t.Fatalf("the handler saw %d more messages for duplicates", after-calls)
	}
	if st := r.Stats(); st.Duplicates-dupsBefore != 29 {
		t.Fatalf("%d duplicates of the redelivered messages, want 29 (%+v)", st.Duplicates-dupsBefore, f.broker.Stats(f.topic))
	}
}

// A commit refused for a deferred constraint names no message: the batch is
// halved until the culprit is alone. With MaxAttempts 1, an attempt counted
// against any other message would dead-letter it.
func TestRefusedCommitInBatchBlamesOnlyTheCulprit(t *testing.T) {
	f := newFixture(t)
	r := f.refusedCommitOf("d005", keys(8, "d"), f.store, consumer.Config{Concurrency: 1, BatchSize: 8, Retry: quickRetry(1)})
	if r.Stats().CommitFailures == 0 {
		t.Fatal("no commit failure counted")
	}
}

// refusedCommitOf publishes ks, whose handler writes commit only if their
// key is allowed by a deferred foreign key (bad is not), runs them through
// store with cfg and checks that bad alone is dead-lettered, for its
// refused commit, and every other key's effect committed once.
func (f *fixture) refusedCommitOf(bad string, ks []string, store dedupdriver.TxStore[pgx.Tx], cfg consumer.Config) *running {
	f.t.Helper()
	allowed := strings.Replace(f.table, `"effects"`, `"allowed"`, 1)
	f.exec(`CREATE TABLE ` + allowed + ` (key text PRIMARY KEY)`)
	f.exec(`ALTER TABLE ` + f.table + ` ADD FOREIGN KEY (key) REFERENCES ` + allowed + ` DEFERRABLE INITIALLY DEFERRED`)
	for _, k := range ks {
		if k != bad {
			f.exec(`INSERT INTO `+allowed+` VALUES ($1)`, k)
		}
	}
	f.publish(ks...)
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(store, f.handler(nil)), cfg)
	f.settled()
	r.stop()
	f.requireOnce(slices.DeleteFunc(slices.Clone(ks), func(k string) bool { return k == bad })...)
	dl := f.broker.DeadLetters(f.topic)
	if len(dl) != 1 || dl[0].Key != bad || !errors.Is(dl[0].Err, dedup.ErrTxRefused) {
		f.t.Fatalf("dead letters = %+v, want %s alone, for its refused commit", dl, bad)
	}
	return r
}

// At batch 1 with messages queued, a lane's commit begins the next
// message's transaction and claims its key in the same round trip (COMMIT
// AND CHAIN). Handler failures between chained commits (the failed
// message's writes and record roll back, the next message begins its own
// transaction) still leave every effect exactly once.
func TestChainedCommits(t *testing.T) {
	f := newFixture(t)
	spy := &statementSpy{prefixes: []string{"COMMIT AND CHAIN"}}
	store := spiedStore(t, f, spy)
	ks := keys(300, "c")
	f.publish(ks...)
	fail := func(msg *consumer.Message, call int) error {
		if call == 1 && strings.HasSuffix(msg.Key, "7") {
			return errors.New("fails once, after its write")
		}
		return nil
	}
	r := f.start(f.broker.Source(f.topic), consumer.Transactional(store, f.handler(fail)),
		consumer.Config{Concurrency: 2, BatchSize: 1, Retry: quickRetry(3)})
	f.settled()
	r.stop()
	f.requireOnce(ks...)
	if dl := f.broker.DeadLetters(f.topic); len(dl) > 0 {
		t.Fatalf("dead letters: %+v", dl)
	}
	if n := f.calls("c007"); n != 2 {
		t.Fatalf("c007 ran %d times, want 2 (a failure, then its retry)", n)
	}
	if n := spy.count(); n == 0 {
		t.Fatal("no commit was chained")
	}
	t.Logf("%d of %d commits chained", spy.count(), len(ks))
}

// A chained commit the database refuses (a deferred constraint) blames its
// own message alone; the next message, whose claim was not made, begins its
// own transaction.
func TestRefusedChainedCommitBlamesOnlyTheCulprit(t *testing.T) {
	f := newFixture(t)
	spy := &statementSpy{prefixes: []string{"COMMIT AND CHAIN"}}
	store := spiedStore(t, f, spy)
	r := f.refusedCommitOf("e005", keys(12, "e"), store, consumer.Config{Concurrency: 1, BatchSize: 1, Retry: quickRetry(1)})
	if r.Stats().CommitFailures == 0 {
		t.Fatal("no commit failure counted")
	}
	if spy.count() == 0 {
		t.Fatal("no commit was chained")
	}
}

// blindStore is pgdedup's driver that cannot tell a failed transaction
// (no Caps.FailedTx) and does nothing else beyond the minimum but classify
// errors: the runner must find a swallowed error from the 25P02 of a later
// statement or from the refused commit.
type blindStore struct{ dedupdriver.Tx[pgx.Tx] }

func (b blindStore) Driver() dedupdriver.Tx[pgx.Tx] { return b }
func (b blindStore) Caps() dedupdriver.Caps {
	return dedupdriver.Caps{Aborted: true, Transient: true}
}

// Order holds under bisect plus an infrastructure failure: A and B of one
// partition key fail together without a culprit, so the batch is halved;
// the half [A] then fails to commit for a reason of the database. B must
// not commit ahead of A: it is held behind A and both are retried.
func TestBisectInfraFailureHoldsPartition(t *testing.T) {
	f := newFixture(t)
	store := newRecordingStore(f.store)
	for _, k := range []string{"A", "B"} {
		f.broker.Publish(f.topic, memsource.Outgoing{Key: k, Body: []byte(k), PartitionKey: "acct-1"})
	}
	var calls atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		for _, m := range msgs {
			if _, err := tx.Exec(ctx, `INSERT INTO `+f.table+` (key, body) VALUES ($1, $2)`, m.Key, string(m.Body)); err != nil {
				return err
			}
		}
		if calls.Add(1) == 1 {
			if len(msgs) != 2 {
				return nil // not the scenario: the test fails below
			}
			store.mu.Lock()
			store.failNext = 1 // the commit of the half [A]
			store.mu.Unlock()
			return errors.New("one of these failed, which one is not said")
		}
		return nil
	}
	r := f.start(f.broker.Source(f.topic), consumer.TransactionalBatch[pgx.Tx](store, h),
		consumer.Config{Concurrency: 1, BatchSize: 2, BatchWait: 500 * time.Millisecond, Retry: quickRetry(3)})
	f.settled()
	r.stop()
	rows, err := f.pool.Query(context.Background(), `SELECT key FROM `+f.table+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	order, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(order, []string{"A", "B"}) {
		t.Fatalf("committed in order %v, want [A B]", order)
	}
}

// slowDeadLetters is a source whose dead-letter publish takes delay, as a
// slow broker's would.
type slowDeadLetters struct {
	consumer.Source
	delay time.Duration
}

func (s slowDeadLetters) DeadLetter(ctx context.Context, m *consumer.Message, reason error) error {
	time.Sleep(s.delay)
	return s.Source.DeadLetter(ctx, m, reason)
}

// No open transaction waits on broker I/O. With the server's
// idle_in_transaction_session_timeout at 200 ms (set for this test's
// sessions only) and a dead-letter publish of 600 ms, a batch that commits
// one message and dead-letters another must not leave the next batch's
// chained transaction idle while it publishes: the server would kill it, and
// the next message would take the blame (with MaxAttempts 1, a dead letter).
func TestNoOpenTransactionWaitsOnDeadLetter(t *testing.T) {
	f := newFixture(t)
	cfg := f.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "200"
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgdedup.New(pool, f.store.Config())
	if err != nil {
		t.Fatal(err)
	}
	// A visibility timeout longer than the dead-letter publish.
	f.visibility(10 * time.Second)
	var ks, bad []string
	for i := range 4 {
		b, g := fmt.Sprintf("bad%d", i), fmt.Sprintf("g%d", i)
		bad = append(bad, b)
		ks = append(ks, g)
		f.publish(g, b) // the next batch starts with an innocent message
	}
	fail := func(msg *consumer.Message, call int) error {
		if strings.HasPrefix(msg.Key, "bad") {
			return errors.New("poison")
		}
		return nil
	}
	src := slowDeadLetters{Source: f.broker.Source(f.topic), delay: 600 * time.Millisecond}
	r := f.start(src, consumer.Transactional(store, f.handler(fail)),
		consumer.Config{Concurrency: 1, BatchSize: 2, Retry: quickRetry(1)})
	var dead []string
	f.waitFor("every message settled, or an innocent one dead-lettered", func(st memsource.TopicStats) bool {
		dead = dead[:0]
		for _, dl := range f.broker.DeadLetters(f.topic) {
			dead = append(dead, dl.Key)
		}
		innocent := slices.ContainsFunc(dead, func(k string) bool { return !strings.HasPrefix(k, "bad") })
		return innocent || (st.Ready == 0 && st.InFlight == 0 && st.Pending == 0)
	})
	r.stop()
	slices.Sort(dead)
	if !slices.Equal(dead, bad) {
		t.Fatalf("dead letters %v, want exactly %v", dead, bad)
	}
	f.requireOnce(ks...)
}

// A handler that ends the runner's transaction itself (ROLLBACK or COMMIT
// through tx) would leave the rest of its batch in autocommit: the earlier
// messages' effects and records rolled back yet acknowledged, or the later
// ones' records committed before their effects. The runner refuses to
// commit such a transaction and blames that handler; every other message
// takes effect exactly once.
func TestHandlerEndingTheTransactionIsBlamed(t *testing.T) {
	for _, stmt := range []string{"ROLLBACK", "COMMIT"} {
		t.Run(stmt, func(t *testing.T) {
			f := newFixture(t)
			f.publish("a", "x", "c")
			h := f.handler(nil)
			ender := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
				if err := h(ctx, tx, msg); err != nil || msg.Key != "x" {
					return err
				}
				_, err := tx.Exec(ctx, stmt)
				return err
			}
			r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, ender),
				consumer.Config{Concurrency: 1, BatchSize: 3, BatchWait: 500 * time.Millisecond, Retry: quickRetry(1)})
			f.settled()
			r.stop()
			var dead []string
			for _, dl := range f.broker.DeadLetters(f.topic) {
				dead = append(dead, dl.Key)
			}
			if !slices.Equal(dead, []string{"x"}) {
				t.Errorf("dead letters %v, want [x]: the handler that ended the transaction is blamed", dead)
			}
			got := f.effects()
			if got["a"] != 1 || got["c"] != 1 {
				t.Errorf("effects %v, want a and c exactly once", got)
			}
		})
	}
}
