package redisdedup_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/deduptest"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// The tests in this file run against the Redis Cluster of the services
// script's redis-cluster profile (three masters, three replicas).

// newClusterStore returns a store on a cluster client of the test cluster,
// closed when t ends.
func newClusterStore(t testing.TB, cfg redisdedup.Config) (*redisdedup.Store, *redis.ClusterClient) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the Redis Cluster; skipped with -short")
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := redisdedup.New(rdb, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s, rdb
}

func TestClusterConformance(t *testing.T) {
	deduptest.RunLeaseStore(t, func(t *testing.T) dedupdriver.LeaseStore {
		s, _ := newClusterStore(t, redisdedup.Config{})
		return s
	})
}

func TestClusterFailureCounterConformance(t *testing.T) {
	deduptest.RunFailureCounter(t, func(t *testing.T, retention time.Duration) dedupdriver.Common {
		s, _ := newClusterStore(t, redisdedup.Config{FailureRetention: retention})
		return s.Driver()
	})
}

// A key's record and its failure count share one slot, whatever the scope
// and key hold (braces, colons, percent signs), so every script touches one
// slot; and the keys of one scope spread over every master.
func TestClusterKeysOfOneRecordShareASlot(t *testing.T) {
	s, rdb := newClusterStore(t, redisdedup.Config{})
	ctx := testContext(t)
	masters := map[string]bool{}
	scopes := []string{"orders", "orders:eu", "{orders}", "a%b", unique("scope")}
	for _, scope := range scopes {
		for i := range 50 {
			key := fmt.Sprintf("key-%d}{%%:%d", i, i)
			record, err := rdb.ClusterKeySlot(ctx, s.RedisKey(scope, key)).Result()
			if err != nil {
				t.Fatal(err)
			}
			failures, err := rdb.ClusterKeySlot(ctx, s.FailuresKey(scope, key)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if record != failures {
				t.Fatalf("scope %q key %q: record in slot %d, failures in slot %d", scope, key, record, failures)
			}
			m, err := rdb.MasterForKey(ctx, s.RedisKey(scope, key))
			if err != nil {
				t.Fatal(err)
			}
			masters[m.Options().Addr] = true
		}
	}
	if len(masters) < 3 {
		t.Fatalf("keys landed on %d masters, want all 3: %v", len(masters), masters)
	}
}

// ClaimBatch and CompleteBatch pipeline keys of many slots through the
// cluster client: each key on its own master.
func TestClusterBatches(t *testing.T) {
	s, _ := newClusterStore(t, redisdedup.Config{})
	ctx := testContext(t)
	scope := unique("batch")
	const n = 200
	recs := make([]dedup.Record, n)
	keys := make([]string, n)
	tokens := make([]string, n)
	for i := range recs {
		keys[i] = fmt.Sprintf("k-%d", i)
		recs[i] = dedup.Record{Key: keys[i], PayloadHash: dedup.HashPayload([]byte(keys[i]))}
		tokens[i] = token()
	}
	claims, err := s.ClaimBatch(ctx, scope, recs, tokens, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range claims {
		if c.State != dedup.StateNew {
			t.Fatalf("claim %d: %v, want new", i, c.State)
		}
	}
	errs, err := s.CompleteBatch(ctx, scope, keys, tokens, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("complete %d: %v", i, e)
		}
	}
	again := make([]string, n)
	for i := range again {
		again[i] = token()
	}
	if claims, err = s.ClaimBatch(ctx, scope, recs, again, time.Minute); err != nil {
		t.Fatal(err)
	}
	for i, c := range claims {
		if c.State != dedup.StateDone {
			t.Fatalf("claim %d after complete: %v, want done", i, c.State)
		}
	}
}

// The master holding a leased key stops; its replica takes over. A lease
// that reached the replica (here made sure with WAIT) survives the failover:
// the holder refreshes and completes it, and another worker's claim finds it
// held, then done. (A lease written in the last moment before the master
// died, not yet replicated, is lost with it: see the package documentation.)
// Not parallel: it stops a node of the shared cluster.
func TestClusterFailoverMidLease(t *testing.T) {
	s, rdb := newClusterStore(t, redisdedup.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	scope, key, holder := unique("failover"), "order-42", token()
	rec := dedup.Record{Key: key, PayloadHash: dedup.HashPayload([]byte("charge"))}
	if c, err := s.Claim(ctx, scope, rec, holder, time.Minute); err != nil || c.State != dedup.StateNew {
		t.Fatalf("claim: %v, %v", c.State, err)
	}
	master, err := rdb.MasterForKey(ctx, s.RedisKey(scope, key))
	if err != nil {
		t.Fatal(err)
	}
	waitReplicated(ctx, t, rdb, s.RedisKey(scope, key))
	node := nodeOf(t, master.Options().Addr)
	testenv.Stop(t, node)
	t.Logf("stopped %s (%s), the master of the key's slot", node, master.Options().Addr)

	// The store has the cluster client reload its slot map when a call
	// fails, so it finds the promoted replica once the failover is done
	// (cluster-node-timeout 2 s); refreshes fail until then. Without the
	// reload, go-redis kept calling the dead master for its 60 s
	// ClusterStateReloadInterval, and the lease expired.
	stopped := time.Now()
	deadline := stopped.Add(time.Minute)
	for {
		err := s.Refresh(ctx, scope, key, holder, time.Minute)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			now, _ := rdb.MasterForKey(ctx, s.RedisKey(scope, key))
			var state map[string]string
			if now != nil {
				state, _ = now.HGetAll(ctx, s.RedisKey(scope, key)).Result()
			}
			t.Fatalf("refresh after the failover: %v (the slot's master now %v holds %v)", err, now, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("the holder refreshed its lease %s after the master stopped", time.Since(stopped).Round(time.Millisecond))
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

// waitReplicated waits until a replica holds key.
func waitReplicated(ctx context.Context, t *testing.T, rdb *redis.ClusterClient, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var found atomic.Bool
		err := rdb.ForEachSlave(ctx, func(ctx context.Context, replica *redis.Client) error {
			conn := replica.Conn()
			defer conn.Close()
			if err := conn.ReadOnly(ctx).Err(); err != nil {
				return err
			}
			n, err := conn.Exists(ctx, key).Result()
			if err == nil && n == 1 {
				found.Store(true)
			}
			return nil
		})
		if err == nil && found.Load() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no replica holds %s after 10 s (%v)", key, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeOf returns the services script's name of the cluster node at addr.
func nodeOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= testenv.RedisClusterNodes; i++ {
		for _, a := range testenv.RedisClusterAddrs(t) {
			if a == addr && i == p-7000 {
				return testenv.RedisClusterNode(i)
			}
		}
	}
	t.Fatalf("%s is no node of the services script's cluster", addr)
	return ""
}
