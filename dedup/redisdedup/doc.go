// Package redisdedup is the Redis store of idemq's lease path: a
// lease store for effects that cannot join a database transaction
// (emails, SMS, webhooks, payment vendors), built on go-redis v9.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	store, err := redisdedup.New(rdb, redisdedup.Config{})
//	...
//	path := consumer.Leased(store, handler, consumer.LeaseOptions{Lease: 30 * time.Second})
//
// New accepts a redis.UniversalClient, so a single node, a Sentinel-managed
// primary (redis.NewFailoverClient) and a Cluster (redis.NewClusterClient)
// all work. It needs Redis 6.2 or newer, or a compatible server.
//
// # Data model
//
// Each key is one Redis hash named Prefix + "{" + scope + ":" + key + "}"
// (for example "idemq:{notify:order-42}"). The braces are a Cluster hash tag,
// so everything about one key lives in one slot; ':', '{', '}' and '%' in the
// scope, and '}' and '%' in the key, are percent-escaped so that no two
// (scope, key) pairs share a name. One read tells the whole state:
//
//	absent                          new: nobody holds or completed the key
//	s=p t=<token> h=<hash> c=<ms>   in progress: token holds a lease; the key's TTL is the lease
//	s=d t=<token> h=<hash> d=<ms>   done: the TTL is the retention; r holds an optional result
//
// Every operation is one Lua script, so it is atomic, and every change after
// the claim compares the caller's token first (compare-and-set): a worker
// whose lease expired can neither extend it, mark it done nor abandon it once
// another token holds the key. The payload digest is stored at claim time, so
// the same key with a different payload is reported as a mismatch both while
// the first copy is in progress and after it is done. Times come from the
// Redis server's clock, so workers' clocks do not matter.
//
// Claim, Refresh, Complete and Abandon are idempotent for one token: go-redis
// retries a command whose reply was lost on the network, and the retry finds
// the state the first try wrote and reports the same outcome.
//
// The store also implements dedupdriver.Common: the handler failures of a
// key are counted in a small hash named like the key's record plus
// ":failures" (same hash tag, so same Cluster slot), incremented by one
// script only when a handler failed (a hash of the count and the payload
// digest it belongs to), deleted when the runner dead-letters the message,
// and otherwise expiring Config.FailureRetention after the last failure.
//
// Beyond the lease operations, the store offers ClaimBatch and CompleteBatch,
// which pipeline many keys in one round trip (each key still atomic on its
// own), and CompleteWithResult and Result, which keep a result (a
// downstream id, a response) with a done key for later deliveries to read.
// Its size limit is the runner's consumer.Config.MaxResultBytes (64 KiB) by
// default; Config.MaxResultBytes may lower it, and a result over it fails
// with dedup.ErrResultTooLarge.
//
// # Redis Cluster and Sentinel
//
// Both are tested against real deployments (the services script's
// redis-cluster and redis-sentinel profiles): the lease-store conformance
// suite passes on each, and a lease survives the failover of the primary
// that held it once the replica had it.
//
// Every script touches one key, and a key's record and failure count share a
// hash tag, so every call is single-slot and ClaimBatch and CompleteBatch
// pipeline keys of any slots. When a call fails, the store asks a
// redis.ClusterClient to reload its slot map: go-redis does that on its own
// only on MOVED and READONLY replies and every ClusterStateReloadInterval
// (60 s by default), so after a master died it kept calling the dead address
// and leases expired unrefreshed. With the reload, a failover
// (cluster-node-timeout 2 s in the tests) interrupts refreshes for a few
// seconds. Replication is asynchronous: a lease or a done mark written just
// before the master died and not yet replicated is lost with it, which opens
// the same window as a restart without persistence (see below).
//
// # Guarantee
//
// While Redis keeps its data, an effect guarded by this store runs at most
// once at a time per key (a second delivery finds the lease held and is
// retried later, never run concurrently), a key marked done is never run
// again within its retention, and a failed attempt leaves the key free for its
// retry.
//
// # Remaining duplicate window
//
// The lease path cannot make the effect and the "done" mark atomic. If the
// worker crashes, hangs past its lease without refreshing, or loses Redis
// after the effect happened and before Complete reached Redis, the key is
// still in progress; when the lease expires, the redelivered message claims
// it again and the effect runs a second time. The window in which a crash
// causes a repeat is one Complete round trip (well under a millisecond on a
// local network); the repeat happens up to one lease after the crash. The
// tests of consumer.Leased in internal/leasepath demonstrate it
// (TestLeaseCrashWindow).
//
// Close the window downstream: the runner hands the handler a stable key,
// consumer.IdempotencyKey(ctx), the same on every attempt. Send it to the
// downstream system as its idempotency key (sinks/webhook sends it as an
// Idempotency-Key header), and the repetition is absorbed there.
//
// Redis durability widens the window. Without persistence (no AOF, no RDB), a
// Redis restart forgets every lease and every done record: messages
// redelivered afterwards run their effects again (with the same key, so a
// downstream that deduplicates still absorbs them). With appendonly yes and
// appendfsync everysec (or no), a crash of Redis's machine loses the writes
// not yet synced, about the last second; a crash of the Redis process alone
// leaves them to the kernel, which writes them (TestCompletedKeysAcrossACrash:
// of the keys completed before a SIGKILL, none was lost with everysec, no or
// always, all of them without persistence). With appendfsync always, Redis
// acknowledges a write only after its fsync.
// Replication is asynchronous: after a Sentinel or Cluster failover, writes the
// old primary had not yet replicated are lost in the same way. Effects that
// must never repeat belong on the transactional path, or must carry the key
// downstream.
//
// The store says which applies: Durability reads INFO persistence and CONFIG
// GET appendfsync and save (of every master of a Cluster) and describes the
// loss, and the Runner calls it once when Run starts, logs one WARN when
// acknowledged records can be lost and reports it in Health.StoreLoss. A
// Redis with CONFIG disabled or renamed cannot show appendfsync, and is
// reported as possibly losing them. With Config.RequireDurable the Runner
// refuses to start instead (a *idemq.ConfigError matching
// dedup.ErrNotDurable) unless appendonly is yes and appendfsync always.
package redisdedup
