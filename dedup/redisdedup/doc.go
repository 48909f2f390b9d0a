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
// own), and CompleteWithResult, which keeps a result (a downstream id, a
// response) with a done key for later deliveries' claims to return.
// Its size limit is the runner's consumer.Config.MaxResultBytes (64 KiB) by
// default; Config.MaxResultBytes may lower it, and a result over it fails
// with dedup.ErrResultTooLarge.
//
// # Redis Cluster and Sentinel
//
// Every script touches one key, and a key's record and failure count share a
// hash tag, so every call is single-slot and ClaimBatch and CompleteBatch
// pipeline keys of any slots. When a call fails, the store asks a
// redis.ClusterClient to reload its slot map, which go-redis otherwise does
// only every ClusterStateReloadInterval (60 s): long enough for leases to
// expire after a master died. Both deployments pass the conformance suite,
// and a lease the replica had received survives a failover; one not yet
// replicated is lost with the master (docs/guarantees.md has the measured
// failovers).
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
// Redis durability widens the window: a record Redis acknowledged and then
// lost (a restart without persistence, a machine crash with appendfsync
// everysec or no, a failover to a replica that had not received it) is a
// processed key forgotten, whose next delivery runs the effect again. Effects
// that must never repeat belong on the transactional path, or must carry the
// key downstream. Durability reads the settings (of every master of a
// Cluster) and says which loss applies; the Runner calls it once when Run
// starts, logs one WARN and reports it in Health.StoreLoss, or, with
// Config.RequireDurable, refuses to start. docs/guarantees.md#redis-durability
// has the table of settings and the measured losses.
package redisdedup
