package redisdedup_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/deduptest"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// The tests in this file run against the services script's redis-sentinel
// profile: a primary and its replica watched by three Sentinels.

// newSentinelStore returns a store on a failover client of the test
// Sentinels, closed when t ends.
func newSentinelStore(t testing.TB, cfg redisdedup.Config) (*redisdedup.Store, *redis.Client) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Redis Sentinel; skipped with -short")
	}
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    testenv.RedisSentinelMaster,
		SentinelAddrs: testenv.RedisSentinelAddrs(t),
	})
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := redisdedup.New(rdb, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s, rdb
}

func TestSentinelConformance(t *testing.T) {
	deduptest.RunLeaseStore(t, func(t *testing.T) dedupdriver.LeaseStore {
		s, _ := newSentinelStore(t, redisdedup.Config{})
		return s
	})
}

// The primary holding a leased key stops; the Sentinels promote its
// replica. A lease the replica had received survives: the holder refreshes
// and completes it, another worker's claim finds it held, then done. Not
// parallel: it stops a node of the shared Sentinel setup.
func TestSentinelFailoverMidLease(t *testing.T) {
	s, _ := newSentinelStore(t, redisdedup.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: testenv.RedisSentinelAddrs(t)[0]})
	defer sentinel.Close()
	primary, err := sentinel.GetMasterAddrByName(ctx, testenv.RedisSentinelMaster).Result()
	if err != nil {
		t.Fatal(err)
	}
	primaryAddr := net.JoinHostPort(primary[0], primary[1])

	scope, key, holder := unique("failover"), "order-42", token()
	rec := dedup.Record{Key: key, PayloadHash: dedup.HashPayload([]byte("charge"))}
	if c, err := s.Claim(ctx, scope, rec, holder, time.Minute); err != nil || c.State != dedup.StateNew {
		t.Fatalf("claim: %v, %v", c.State, err)
	}
	// The replica has the lease before the primary goes.
	replicas, err := sentinel.Replicas(ctx, testenv.RedisSentinelMaster).Result()
	if err != nil || len(replicas) == 0 {
		t.Fatalf("replicas: %v, %v", replicas, err)
	}
	replica := redis.NewClient(&redis.Options{Addr: net.JoinHostPort(replicas[0]["ip"], replicas[0]["port"])})
	defer replica.Close()
	deadline := time.Now().Add(10 * time.Second)
	for replica.Exists(ctx, s.RedisKey(scope, key)).Val() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the replica does not hold the lease after 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	node := testenv.RedisSentinelNode(1)
	if primary[1] == "7102" {
		node = testenv.RedisSentinelNode(2)
	}
	testenv.Stop(t, node)
	stopped := time.Now()
	t.Logf("stopped %s (%s), the primary", node, primaryAddr)
	deadline = stopped.Add(time.Minute)
	for {
		err := s.Refresh(ctx, scope, key, holder, time.Minute)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refresh after the failover: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	now, _ := sentinel.GetMasterAddrByName(ctx, testenv.RedisSentinelMaster).Result()
	t.Logf("the holder refreshed its lease %s after the primary stopped; the primary is now %v",
		time.Since(stopped).Round(time.Millisecond), now)
	if c, err := s.Claim(ctx, scope, rec, token(), time.Minute); err != nil || c.State != dedup.StateInProgress {
		t.Fatalf("another worker's claim after the failover: %v, %v; want in-progress", c.State, err)
	}
	if err := s.Complete(ctx, scope, key, holder, time.Hour); err != nil {
		t.Fatalf("complete after the failover: %v", err)
	}
	if c, err := s.Claim(ctx, scope, rec, token(), time.Minute); err != nil || c.State != dedup.StateDone {
		t.Fatalf("claim after complete: %v, %v; want done", c.State, err)
	}
	testenv.Start(t, node) // rejoins as a replica
}
