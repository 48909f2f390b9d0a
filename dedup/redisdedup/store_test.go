package redisdedup_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/deduptest"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// newClient returns a client of the test Redis, closed when t ends.
func newClient(t testing.TB) *redis.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Redis; skipped with -short")
	}
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatalf("parse Redis URL: %v", err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func newStore(t testing.TB, cfg redisdedup.Config) (*redisdedup.Store, *redis.Client) {
	t.Helper()
	rdb := newClient(t)
	s, err := redisdedup.New(rdb, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s, rdb
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func unique(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func token() string { return unique("tok") }

func TestConformance(t *testing.T) {
	deduptest.RunLeaseStore(t, func(t *testing.T) dedupdriver.LeaseStore {
		s, _ := newStore(t, redisdedup.Config{})
		return s
	})
}

func TestNewValidatesConfig(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
		cfg  redisdedup.Config
	}{
		{"nil client", nil, redisdedup.Config{}},
		{"brace in prefix", rdb, redisdedup.Config{Prefix: "app{1}:"}},
		{"negative result limit", rdb, redisdedup.Config{MaxResultBytes: -1}},
	} {
		if _, err := redisdedup.New(tc.rdb, tc.cfg); !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("%s: New err = %v, want idemq.ErrInvalidConfig", tc.name, err)
		}
	}
	s, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		t.Fatalf("New with the zero Config: %v", err)
	}
	if got := s.Config(); got.Prefix != redisdedup.DefaultPrefix || got.MaxResultBytes != 64<<10 {
		t.Fatalf("defaults not applied: %+v", got)
	}
}

func TestRedisKeyLayout(t *testing.T) {
	s, err := redisdedup.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), redisdedup.Config{Prefix: "app:"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ scope, key, want string }{
		{"notify", "order-42", "app:{notify:order-42}"},
		{"a:b", "c", "app:{a%3Ab:c}"},
		{"a", "b:c", "app:{a:b:c}"},
		{"x{y}", "z}", "app:{x%7By%7D:z%7D}"},
		{"50%", "k%", "app:{50%25:k%25}"},
	} {
		if got := s.RedisKey(tc.scope, tc.key); got != tc.want {
			t.Errorf("RedisKey(%q, %q) = %q, want %q", tc.scope, tc.key, got, tc.want)
		}
		// The hash tag is everything between the first '{' and the next
		// '}': it must span scope and key, so their records share a slot.
		name := s.RedisKey(tc.scope, tc.key)
		open := strings.IndexByte(name, '{')
		if close := strings.IndexByte(name[open+1:], '}'); open+1+close != len(name)-1 {
			t.Errorf("RedisKey(%q, %q) = %q: hash tag does not span scope and key", tc.scope, tc.key, name)
		}
	}
}

func TestInvalidArguments(t *testing.T) {
	s, _ := newStore(t, redisdedup.Config{})
	ctx := testContext(t)
	scope, h := unique("args"), dedup.HashPayload([]byte("x"))
	checks := map[string]error{
		"claim empty key":       errOf(s.Claim(ctx, scope, dedup.Record{PayloadHash: h}, token(), time.Second)),
		"claim empty token":     errOf(s.Claim(ctx, scope, dedup.Record{Key: "k", PayloadHash: h}, "", time.Second)),
		"claim zero lease":      errOf(s.Claim(ctx, scope, dedup.Record{Key: "k", PayloadHash: h}, token(), 0)),
		"refresh negative":      s.Refresh(ctx, scope, "k", token(), -time.Second),
		"complete no retention": s.Complete(ctx, scope, "k", token(), 0),
		"abandon empty token":   s.Abandon(ctx, scope, "k", ""),
	}
	for name, err := range checks {
		if !errors.Is(err, redisdedup.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := s.Inspect(ctx, scope, "k"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("invalid calls wrote a record: Inspect err = %v", err)
	}
}

func errOf(_ dedup.Claim, err error) error { return err }

// go-redis retries a command whose reply was lost; the retry must report the
// outcome of the first try.
func TestIdempotentForOneToken(t *testing.T) {
	s, _ := newStore(t, redisdedup.Config{})
	ctx := testContext(t)
	scope, h, tok := unique("idem"), dedup.HashPayload([]byte("x")), token()
	r := dedup.Record{Key: "k", PayloadHash: h}
	for i := range 2 {
		c, err := s.Claim(ctx, scope, r, tok, time.Minute)
		if err != nil || c.State != dedup.StateNew {
			t.Fatalf("claim %d by the same token = %v, %v; want new", i, c.State, err)
		}
	}
	for i := range 2 {
		if err := s.Complete(ctx, scope, "k", tok, time.Hour); err != nil {
			t.Fatalf("complete %d by the same token: %v", i, err)
		}
	}
	if c, err := s.Claim(ctx, scope, r, tok, time.Minute); err != nil || c.State != dedup.StateDone {
		t.Fatalf("claim after complete by the completing token = %v, %v; want done", c.State, err)
	}
}

func TestCompleteWithResult(t *testing.T) {
	s, _ := newStore(t, redisdedup.Config{MaxResultBytes: 16})
	ctx := testContext(t)
	scope, h := unique("result"), dedup.HashPayload([]byte("x"))
	tok := token()
	if _, err := s.Claim(ctx, scope, dedup.Record{Key: "k", PayloadHash: h}, tok, time.Minute); err != nil {
		t.Fatal(err)
	}
	if e, err := s.Inspect(ctx, scope, "k"); err != nil || !e.InProgress || e.Result != nil {
		t.Fatalf("Inspect of a key in progress = %+v, %v; want in progress without a result", e, err)
	}
	err := s.CompleteWithResult(ctx, scope, "k", tok, time.Hour, []byte("far more than sixteen bytes"))
	if !errors.Is(err, redisdedup.ErrInvalidArgument) {
		t.Fatalf("oversized result: err = %v, want ErrInvalidArgument", err)
	}
	if err := s.CompleteWithResult(ctx, scope, "k", tok, time.Hour, []byte("msg-id 7")); err != nil {
		t.Fatalf("CompleteWithResult: %v", err)
	}
	if e, err := s.Inspect(ctx, scope, "k"); err != nil || string(e.Result) != "msg-id 7" {
		t.Fatalf("Inspect: result %q, %v; want the stored result", e.Result, err)
	}

	tok2 := token()
	if _, err := s.Claim(ctx, scope, dedup.Record{Key: "plain", PayloadHash: h}, tok2, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, scope, "plain", tok2, time.Hour); err != nil {
		t.Fatal(err)
	}
	if e, err := s.Inspect(ctx, scope, "plain"); err != nil || e.Result != nil {
		t.Fatalf("Inspect of a key completed without a result: %q, %v; want nil, nil", e.Result, err)
	}
}

// After SCRIPT FLUSH (or a Redis restart) the cached scripts are gone; the
// store must load them again transparently.
func TestScriptCacheFlushed(t *testing.T) {
	s, rdb := newStore(t, redisdedup.Config{})
	ctx := testContext(t)
	scope, h := unique("flush"), dedup.HashPayload([]byte("x"))
	tok := token()
	if _, err := s.Claim(ctx, scope, dedup.Record{Key: "k", PayloadHash: h}, tok, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, scope, "k", tok, time.Hour); err != nil {
		t.Fatalf("Complete after SCRIPT FLUSH: %v", err)
	}
}

// A key that holds something else (another application's data under the
// same prefix) gives an error, never a wrong state.
func TestForeignValue(t *testing.T) {
	s, rdb := newStore(t, redisdedup.Config{})
	ctx := testContext(t)
	scope := unique("foreign")
	if err := rdb.Set(ctx, s.RedisKey(scope, "k"), "not a hash", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Claim(ctx, scope, dedup.Record{Key: "k"}, token(), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("claim of a key holding a string: err = %v, want WRONGTYPE", err)
	}
}

// TTLs on the record are the lease while in progress and the retention once
// done, as Inspect reports them.
func TestInspectTimes(t *testing.T) {
	s, rdb := newStore(t, redisdedup.Config{})
	ctx := testContext(t)
	scope, h, tok := unique("times"), dedup.HashPayload([]byte("x")), token()
	if _, err := s.Claim(ctx, scope, dedup.Record{Key: "k", PayloadHash: h}, tok, time.Minute); err != nil {
		t.Fatal(err)
	}
	e, err := s.Inspect(ctx, scope, "k")
	if err != nil {
		t.Fatal(err)
	}
	// Both times are whole milliseconds read at slightly different moments,
	// so the difference may exceed the lease by a millisecond or two.
	if lease := e.LeaseUntil.Sub(e.ProcessedAt); lease <= 50*time.Second || lease > time.Minute+time.Second {
		t.Fatalf("lease in Inspect = %v, want about a minute", lease)
	}
	if err := s.Complete(ctx, scope, "k", tok, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	ttl, err := rdb.PTTL(ctx, s.RedisKey(scope, "k")).Result()
	if err != nil || ttl <= time.Hour || ttl > 2*time.Hour {
		t.Fatalf("TTL of a done record = %v, %v; want the retention", ttl, err)
	}
	e, err = s.Inspect(ctx, scope, "k")
	if err != nil || e.InProgress || !e.LeaseUntil.IsZero() || e.ExpiresAt.Sub(e.ProcessedAt) <= time.Hour {
		t.Fatalf("Inspect of a done record = %+v, %v", e, err)
	}
}

// Many workers racing over many keys, each completing what it wins: every
// key is won exactly once, and a stale token never completes a key.
func TestManyKeysManyWorkers(t *testing.T) {
	s, _ := newStore(t, redisdedup.Config{})
	ctx := testContext(t)
	scope, h := unique("many"), dedup.HashPayload([]byte("x"))
	const workers, keys = 8, 200
	wins := make([]int, keys)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for k := range keys {
				key := "k" + string(rune('A'+k%26)) + hex.EncodeToString([]byte{byte(k)})
				tok := token()
				c, err := s.Claim(ctx, scope, dedup.Record{Key: key, PayloadHash: h}, tok, time.Minute)
				if err != nil {
					errs <- err
					return
				}
				if c.State != dedup.StateNew {
					continue
				}
				mu.Lock()
				wins[k]++
				mu.Unlock()
				if err := s.Complete(ctx, scope, key, tok, time.Hour); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k, n := range wins {
		if n != 1 {
			t.Fatalf("key %d won %d times, want exactly once", k, n)
		}
	}
}

// The payload digest is stored at claim time, so this store reports a
// mismatch while the first payload is still in progress (the conformance
// suite also allows "in progress" there).
func TestMismatchWhileInProgress(t *testing.T) {
	s, _ := newStore(t, redisdedup.Config{})
	ctx := testContext(t)
	scope, h1, h2 := unique("mm"), dedup.HashPayload([]byte("one")), dedup.HashPayload([]byte("two"))
	if _, err := s.Claim(ctx, scope, dedup.Record{Key: "k", PayloadHash: h1}, token(), time.Minute); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, scope, dedup.Record{Key: "k", PayloadHash: h2}, token(), time.Minute)
	if err != nil || c.State != dedup.StateMismatch || c.StoredHash != h1 || c.ProcessedAt.IsZero() {
		t.Fatalf("claim with another payload while in progress = %+v, %v; want mismatch with the first hash", c, err)
	}
}

// The batch operations give the answers of the single ones, in order, also
// after the server forgot the scripts.
func TestBatch(t *testing.T) {
	s, rdb := newStore(t, redisdedup.Config{})
	ctx := testContext(t)
	scope := unique("batch")
	h1, h2 := dedup.HashPayload([]byte("one")), dedup.HashPayload([]byte("two"))
	rec := func(k string, h dedup.Hash) dedup.Record { return dedup.Record{Key: k, PayloadHash: h} }

	done, held := token(), token()
	for _, c := range []struct {
		key, tok string
		complete bool
	}{{"done", done, true}, {"held", held, false}, {"other", token(), true}} {
		if _, err := s.Claim(ctx, scope, rec(c.key, h1), c.tok, time.Minute); err != nil {
			t.Fatal(err)
		}
		if c.complete {
			if err := s.Complete(ctx, scope, c.key, c.tok, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	recs := []dedup.Record{rec("new", h1), rec("done", h1), rec("held", h1), rec("other", h2)}
	toks := []string{token(), token(), token(), token()}
	claims, err := s.ClaimBatch(ctx, scope, recs, toks, time.Minute)
	if err != nil {
		t.Fatalf("ClaimBatch: %v", err)
	}
	want := []dedup.State{dedup.StateNew, dedup.StateDone, dedup.StateInProgress, dedup.StateMismatch}
	for i, c := range claims {
		if c.Key != recs[i].Key || c.State != want[i] {
			t.Fatalf("claim %d = %s %v, want %s %v", i, c.Key, c.State, recs[i].Key, want[i])
		}
	}
	// Repeating the batch with the same tokens changes nothing.
	if again, err := s.ClaimBatch(ctx, scope, recs, toks, time.Minute); err != nil || again[0].State != dedup.StateNew {
		t.Fatalf("repeated ClaimBatch = %v, %v", again, err)
	}

	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	results, err := s.CompleteBatch(ctx, scope, []string{"new", "held", "nobody"}, []string{toks[0], held, token()}, time.Hour)
	if err != nil {
		t.Fatalf("CompleteBatch: %v", err)
	}
	if results[0] != nil || results[1] != nil || !errors.Is(results[2], dedup.ErrLeaseLost) {
		t.Fatalf("CompleteBatch results = %v, want nil, nil, lease lost", results)
	}
	for _, k := range []string{"new", "held"} {
		if c, err := s.Claim(ctx, scope, rec(k, h1), token(), time.Minute); err != nil || c.State != dedup.StateDone {
			t.Fatalf("claim of %s after CompleteBatch = %v, %v; want done", k, c.State, err)
		}
	}

	if _, err := s.ClaimBatch(ctx, scope, recs, toks[:1], time.Minute); !errors.Is(err, redisdedup.ErrInvalidArgument) {
		t.Fatalf("ClaimBatch with too few tokens: err = %v", err)
	}
	if _, err := s.CompleteBatch(ctx, scope, []string{"a"}, nil, time.Hour); !errors.Is(err, redisdedup.ErrInvalidArgument) {
		t.Fatalf("CompleteBatch with too few tokens: err = %v", err)
	}
}

func TestFailureCounterConformance(t *testing.T) {
	deduptest.RunFailureCounter(t, func(t *testing.T, retention time.Duration) dedupdriver.Common {
		s, _ := newStore(t, redisdedup.Config{FailureRetention: retention})
		return s.Driver()
	})
}
