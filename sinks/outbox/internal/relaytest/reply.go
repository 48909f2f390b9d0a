package relaytest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/sinks/outbox"
)

// Environment of the replier child process.
const (
	replyChildEnv    = "IDEMQ_REPLY_CHILD" // "1" in the child
	replyDBEnv       = "IDEMQ_REPLY_DB"
	replySchemaEnv   = "IDEMQ_REPLY_SCHEMA"
	replyRequestsEnv = "IDEMQ_REPLY_REQUESTS"
	replyKillEnv     = "IDEMQ_REPLY_KILL_AFTER" // commits after which the child kills itself
)

// ReplierChildTestName is the name of the test function each broker's
// package defines to run ReplierMain.
const ReplierChildTestName = "TestHelperReplierChild"

// ReplierName is the consumer Name of the replying worker: reply ids are
// "replier:<request key>/reply".
const ReplierName = "replier"

// ReplyBroker is what the request/reply scenario needs of one broker.
type ReplyBroker struct {
	// Requests names the request queue or topic; ReplyTo is the reply
	// destination as requests name it.
	Requests, ReplyTo string
	// Env is the broker's environment for the replier child.
	Env []string
	// Send publishes a request with key (its idempotency key), body and
	// correlation id, asking for a reply to ReplyTo.
	Send func(t testing.TB, key, body, corr string)
	// Source returns a source over the requests (in the child too).
	Source func(t testing.TB, requests string) consumer.Source
	// Replies returns the requester's source over ReplyTo.
	Replies func(t testing.TB) consumer.Source
	// Publisher returns the relay's publisher (in the child too).
	Publisher func(t testing.TB) outbox.Publisher
}

// committedKill SIGKILLs its own process right after the after-th commit
// of the replier: between the commit of an effect with its reply row and
// both the request's ack and the reply's publish.
type committedKill struct {
	after int64
	n     atomic.Int64
}

func (k *committedKill) OnCommit(_ context.Context, _ *consumer.Message, c consumer.CommitInfo) {
	if c.Err == nil && k.after > 0 && k.n.Add(1) >= k.after {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// startReplier runs the replying worker over src and a relay through pub
// until ctx is done: a Transactional handler over pgdedup (in schema) that
// inserts the request into reply_effects and answers "ok:"+body through
// outbox.Reply, with an outbox.Resender. It kills its process after
// killAfter commits (never when 0).
func startReplier(ctx context.Context, t testing.TB, pool *pgxpool.Pool, schema string, src consumer.Source, pub outbox.Publisher, killAfter int64) (*consumer.Runner, <-chan error) {
	t.Helper()
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	resend, err := outbox.NewResender(pool, outbox.ResendConfig{Logger: Logger()})
	if err != nil {
		t.Fatal(err)
	}
	h := outbox.Reply(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO reply_effects (key, body) VALUES ($1, $2)`, msg.Key, string(msg.Body)); err != nil {
			return nil, err
		}
		return []byte("ok:" + string(msg.Body)), nil
	})
	r, err := consumer.NewRunner(src, consumer.Transactional(store, h), consumer.Config{
		// One request per transaction: every commit is a point to be killed
		// at, so the kills land while most requests still wait (the default
		// batch would commit everything queued at the first commit).
		Name: ReplierName, Concurrency: 2, BatchSize: 1, Logger: Logger(),
		Hooks: []consumer.Hook{resend, &committedKill{after: killAfter}},
	})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, pub, FastConfig())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { done <- r.Run(ctx) }()
	go func() { done <- relay.Run(ctx) }()
	return r, done
}

// ReplierMain is the body of the replier child process: the replying
// worker and a relay over the database and requests the parent named,
// SIGKILLed after the number of commits the parent asked for. It skips
// the test when not started by RunReply.
func ReplierMain(t *testing.T, newSource func(t testing.TB, requests string) consumer.Source, newPub func(t testing.TB) outbox.Publisher) {
	if os.Getenv(replyChildEnv) != "1" {
		t.Skip("helper process of a request/reply crash test")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(replyDBEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	after, _ := strconv.ParseInt(os.Getenv(replyKillEnv), 10, 64)
	_, done := startReplier(ctx, t, pool, os.Getenv(replySchemaEnv), newSource(t, os.Getenv(replyRequestsEnv)), newPub(t), after)
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// delivery is one reply as the requester received it.
type delivery struct{ id, corr, body string }

// requester records every reply delivery (a hook) before its runner
// deduplicates it by the reply's idempotency key.
type requester struct {
	mu  sync.Mutex
	got []delivery
}

func (q *requester) OnReceived(ctx context.Context, m *consumer.Message) context.Context {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.got = append(q.got, delivery{id: m.Key, corr: m.CorrelationID, body: string(m.Body)})
	return ctx
}

func (q *requester) deliveries() []delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]delivery(nil), q.got...)
}

// RunReply is the request/reply scenario on one broker. n requests are
// answered by replier child processes, each SIGKILLed right after its 1st,
// 2nd or 3rd commit (kills of them: after the effect and its reply row
// committed, before the request's ack and the reply's publish), then by a
// replier in this process (n is raised to 3*kills+10 if less). Then dups more requests are answered and sent
// again, with a new correlation id, once their replies arrived. It fails t
// unless every request took effect once, the requester's consumer got a
// reply for every request (id "replier:<key>/reply", body "ok:<body>"),
// each repeated request got a reply with the same id and body under its
// own correlation id, and the requester absorbed the repeats.
func RunReply(t *testing.T, b ReplyBroker, n, dups, kills int) {
	t.Helper()
	n = max(n, 3*kills+10) // enough requests for every kill
	start := time.Now()
	ctx := context.Background()
	pool, schema, dbURL := NewPool(t)
	for _, q := range []string{
		`CREATE TABLE reply_effects (key text NOT NULL, body text NOT NULL)`,
		`CREATE TABLE replies (id text NOT NULL, body text NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// sent holds each request's body and the correlation ids it was sent
	// with, by reply id.
	type request struct {
		body  string
		corrs map[string]bool
	}
	sent := map[string]*request{}
	send := func(key, body, corr string) {
		id := ReplierName + ":" + key + outbox.ReplySuffix
		if sent[id] == nil {
			sent[id] = &request{body: body, corrs: map[string]bool{}}
		}
		sent[id].corrs[corr] = true
		b.Send(t, key, body, corr)
	}
	for i := range n {
		send(fmt.Sprintf("q-%d", i), strconv.Itoa(i), fmt.Sprintf("c-%d", i))
	}

	// The requester: an idemq consumer of the replies, deduplicating by
	// the reply's idempotency key.
	q := &requester{}
	rq, err := consumer.NewRunner(b.Replies(t), consumer.Transactional(store, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO replies (id, body) VALUES ($1, $2)`, msg.Key, string(msg.Body))
		return err
	}), consumer.Config{Name: "requester", Logger: Logger(), Hooks: []consumer.Hook{q}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rdone := make(chan error, 1)
	go func() { rdone <- rq.Run(rctx) }()

	// check fails t at the first reply whose id, body or correlation id
	// no request explains.
	check := func() {
		t.Helper()
		for _, d := range q.deliveries() {
			req := sent[d.id]
			switch {
			case req == nil:
				t.Fatalf("reply with id %q, which no request has", d.id)
			case d.body != "ok:"+req.body:
				t.Fatalf("reply %s has body %q, want %q", d.id, d.body, "ok:"+req.body)
			case !req.corrs[d.corr]:
				t.Fatalf("reply %s has correlation id %q, not one its requests were sent with", d.id, d.corr)
			}
		}
	}

	count := func(query string) (total, distinct int) {
		if err := pool.QueryRow(ctx, query).Scan(&total, &distinct); err != nil {
			t.Fatal(err)
		}
		return total, distinct
	}
	effects := func() (int, int) { return count(`SELECT count(*), count(DISTINCT key) FROM reply_effects`) }
	replies := func() (int, int) { return count(`SELECT count(*), count(DISTINCT id) FROM replies`) }

	env := append(b.Env[:len(b.Env):len(b.Env)], replyChildEnv+"=1", replyDBEnv+"="+dbURL, replySchemaEnv+"="+schema, replyRequestsEnv+"="+b.Requests)
	killed := 0
	for i := 0; killed < kills; i++ {
		if _, d := effects(); d == n {
			break
		}
		c := StartChild(t, ReplierChildTestName, append(env, replyKillEnv+"="+strconv.Itoa(1+i%3)))
		select {
		case <-c.Done():
			if !c.Killed() {
				t.Fatalf("replier child ended without being killed: %v\n%s", c.Err(), c.Output())
			}
			killed++
			if os.Getenv("IDEMQ_TEST_LOG") == "1" {
				t.Logf("replier child %d:\n%s", c.Pid(), c.Output())
			}
		case <-time.After(WaitTimeout):
			c.Kill()
			t.Fatalf("replier child did not kill itself\n%s", c.Output())
		}
	}
	t.Logf("%s: %d kills", time.Since(start).Round(time.Millisecond), killed)
	if killed < kills {
		t.Fatalf("only %d kills before every request took effect; the test proves too little", killed)
	}

	// The last replier, in this process, answers the rest and the
	// redeliveries of the killed ones' requests.
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	rp, ldone := startReplier(lctx, t, pool, schema, b.Source(t, b.Requests), b.Publisher(t), 0)
	state := func() string {
		e, ed := effects()
		r, rd := replies()
		return fmt.Sprintf("effects %d (%d requests), replies %d (%d ids), repeats answered %d of %d; replier %+v; requester %+v; outbox %s",
			e, ed, r, rd, countAgain(q.deliveries()), dups, rp.Stats(), rq.Stats(), Describe(t, pool))
	}
	answered := func(want int) func() bool {
		return func() bool {
			_, ed := effects()
			_, rd := replies()
			return ed == want && rd == want
		}
	}
	WaitFor(t, state, answered(n))
	t.Logf("%s: every request answered", time.Since(start).Round(time.Millisecond))

	// Repeats: requests whose replies arrived, sent again with a new
	// correlation id (a requester that lost the reply), on keys no kill
	// touched, so that no redelivery of the first copy races the repeat.
	for i := range dups {
		send(fmt.Sprintf("p-%d", i), strconv.Itoa(n+i), fmt.Sprintf("c-p-%d", i))
	}
	WaitFor(t, state, answered(n+dups))
	before := rp.Stats().Duplicates
	for i := range dups {
		send(fmt.Sprintf("p-%d", i), strconv.Itoa(n+i), fmt.Sprintf("c-p-%d-again", i))
	}
	// Once the replier settled the repeats as duplicates and the relay
	// has nothing pending, their replies are on the broker: the requester
	// gets them within seconds, or they were never sent.
	WaitFor(t, state, func() bool { return rp.Stats().Duplicates >= before+uint64(dups) && Counts(t, pool).Pending == 0 })
	t.Logf("%s: repeats settled as duplicates", time.Since(start).Round(time.Millisecond))
	deadline := time.Now().Add(10 * time.Second)
	for countAgain(q.deliveries()) < dups {
		check()
		if time.Now().After(deadline) {
			t.Fatalf("the repeated requests got %d replies, want %d: %s", countAgain(q.deliveries()), dups, state())
		}
		time.Sleep(20 * time.Millisecond)
	}
	lcancel()
	for range 2 {
		if err := <-ldone; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
	cancel()
	if err := <-rdone; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}

	if e, ed := effects(); e != n+dups || ed != n+dups {
		t.Fatalf("%d effects for %d distinct requests, want %d", e, ed, n+dups)
	}
	if r, rd := replies(); r != n+dups || rd != n+dups {
		t.Fatalf("requester handled %d replies with %d distinct ids, want %d", r, rd, n+dups)
	}
	check()
	rs, ps := rq.Stats(), rp.Stats()
	t.Logf("%d requests + %d repeated, %d replier processes SIGKILLed after a commit; last replier: %d handled, %d duplicates; requester: %d replies delivered, %d handled, %d absorbed",
		n+dups, dups, killed, ps.Handled, ps.Duplicates, len(q.deliveries()), rs.Handled, rs.Duplicates)
	if rs.Duplicates < uint64(dups) {
		t.Fatalf("the requester absorbed %d repeated replies, want at least %d", rs.Duplicates, dups)
	}
}

// countAgain counts the distinct replies delivered to a repeated request
// (a correlation id ending in "-again").
func countAgain(ds []delivery) int {
	seen := map[string]bool{}
	for _, d := range ds {
		if strings.HasSuffix(d.corr, "-again") {
			seen[d.id] = true
		}
	}
	return len(seen)
}

// ReplyKills returns the number of replier kills of a RunReply test:
// IDEMQ_REPLY_KILLS when set (a longer run), else def.
func ReplyKills(def int) int {
	if n, err := strconv.Atoi(os.Getenv("IDEMQ_REPLY_KILLS")); err == nil && n > 0 {
		return n
	}
	return def
}
