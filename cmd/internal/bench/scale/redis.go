package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/cmd/internal/bench/pgload"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisdedup"
)

// redisMemory measures the memory the lease path's Redis store takes per
// key: it starts a redis-server of its own (no persistence, on a free
// loopback port, stopped at the end), claims and completes real keys
// through redisdedup (ClaimBatch, then CompleteBatch with the 8-day
// retention: each key a done hash with a TTL, as the Runner leaves it),
// the first realKeys of them one by one through the store and the rest as
// copies of one of those (DUMP, then RESTORE under the name the store gives
// a new UUID key, with the same TTL: the same encoding, written many times
// faster), and prints used_memory per key and its extrapolation to target
// keys.
func redisMemory(ctx context.Context, n, target int) error {
	const realKeys = 100_000
	port, err := freePort()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "idemq-bench-scale-redis-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := srv.Start(); err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	defer func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	defer rdb.Close()
	for i := 0; ; i++ {
		if err := rdb.Ping(ctx).Err(); err == nil {
			break
		} else if i == 100 {
			return fmt.Errorf("redis-server does not answer: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	version := rdb.Info(ctx, "server").Val()
	store, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		return err
	}
	before, err := usedMemory(ctx, rdb)
	if err != nil {
		return err
	}
	start := time.Now()
	const batch = 1000
	raw := make([]byte, 16*batch)
	var model string // a key the store wrote
	for done := 0; done < n; {
		m := min(batch, n-done)
		_, _ = rand.Read(raw)
		if done >= realKeys && model != "" {
			dump, err := rdb.Dump(ctx, model).Result()
			if err != nil {
				return err
			}
			pipe := rdb.Pipeline()
			for i := range m {
				pipe.Restore(ctx, store.RedisKey(fillScopes[0], pgload.UUID(raw[16*i:16*(i+1)])), dedup.DefaultRetention, dump)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
			done += m
			continue
		}
		recs := make([]dedup.Record, m)
		keys, tokens := make([]string, m), make([]string, m)
		for i := range recs {
			key := pgload.UUID(raw[16*i : 16*(i+1)])
			recs[i] = dedup.Record{Key: key, PayloadHash: dedup.HashPayload([]byte(key))}
			// A token as the Runner makes one: 16 random bytes in hex.
			keys[i], tokens[i] = key, hex.EncodeToString(raw[16*((i+1)%m):][:16])
		}
		if _, err := store.ClaimBatch(ctx, fillScopes[0], recs, tokens, time.Minute); err != nil {
			return err
		}
		errs, err := store.CompleteBatch(ctx, fillScopes[0], keys, tokens, dedup.DefaultRetention)
		if err == nil {
			err = errors.Join(errs...)
		}
		if err != nil {
			return err
		}
		model = store.RedisKey(fillScopes[0], keys[0])
		done += m
	}
	took := time.Since(start)
	after, err := usedMemory(ctx, rdb)
	if err != nil {
		return err
	}
	keys, err := rdb.DBSize(ctx).Result()
	if err != nil {
		return err
	}
	ttl, _ := rdb.TTL(ctx, store.RedisKey(fillScopes[0], pgload.UUID(raw[:16]))).Result()
	per := float64(after-before) / float64(keys)
	fmt.Printf("\nredis (%s): %d keys (done, retention %s, the last one's TTL %s; the first %d written by the store, the rest restored copies of one) in %.1f s; used_memory %s -> %s: %.0f bytes per key; at %d keys: %.1f GiB\n",
		serverVersion(version), keys, dedup.DefaultRetention, ttl.Round(time.Hour), min(n, realKeys), took.Seconds(),
		pgload.MiB(before), pgload.MiB(after), per, target, per*float64(target)/(1<<30))
	return nil
}

func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("INFO memory has no used_memory")
}

func serverVersion(info string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return "Redis " + v
		}
	}
	return "Redis"
}
