package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/internal/testenv"
)

func newStore(tb testing.TB) *redisdedup.Store {
	tb.Helper()
	if testing.Short() {
		tb.Skip("needs Redis; skipped with -short")
	}
	opts, err := redis.ParseURL(testenv.RedisURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	tb.Cleanup(func() { _ = rdb.Close() })
	s, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// The command runs end to end on a small load.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis; skipped with -short")
	}
	var out strings.Builder
	if err := run(&out, testenv.RedisURL(t), 300, 4, 1); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "runner lease path") {
		t.Fatalf("output:\n%s", out.String())
	}
}

// BenchmarkRunnerLeasePath measures the runner's lease path on the in-memory
// source with a no-op effect, per message, at concurrency 8.
//
//	go -C cmd/internal test -run '^$' -bench . ./bench/lease
func BenchmarkRunnerLeasePath(b *testing.B) {
	s := newStore(b)
	b.ResetTimer()
	if _, err := runLeasePath(context.Background(), s, b.N, 8, 1); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRawClaim is the ceiling BenchmarkRunnerLeasePath is compared with:
// the Lua claim from 8 goroutines.
func BenchmarkRawClaim(b *testing.B) {
	s := newStore(b)
	b.ResetTimer()
	if _, err := rawClaim(false)(context.Background(), s, b.N, 8); err != nil {
		b.Fatal(err)
	}
}
