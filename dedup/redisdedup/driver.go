package redisdedup

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// leaseDriver is the store's side of the lease path's protocol
// (dedupdriver.Lease), which the consumer.Runner drives: the store's own
// lease operations, and the failure counts.
type leaseDriver struct{ *Store }

// The driver implements the whole protocol, checked at compile time.
var _ dedupdriver.Lease = leaseDriver{}

// Driver returns the store's driver, which consumer.Leased takes the store
// for. Only a wrapper of the store (to count, trace or inject faults) needs
// to call it.
func (s *Store) Driver() dedupdriver.Lease { return leaseDriver{s} }

// Caps implements dedupdriver.Lease: redisdedup claims batches in one
// pipeline, keeps results, counts failures and reads Redis's persistence
// settings (Store.Durability).
func (leaseDriver) Caps() dedupdriver.Caps {
	return dedupdriver.Caps{BatchClaim: true, Results: true, FailureCount: true, Durability: true}
}

// CheckSchema implements dedupdriver.Lease: Redis has no schema, so it
// returns dedupdriver.ErrUnsupported (Caps.SchemaCheck is false).
func (leaseDriver) CheckSchema(context.Context) error { return dedupdriver.ErrUnsupported }

// failuresSuffix follows the record's Redis key in the name of its
// handler-failure counter. A record's name ends with '}', so no record can
// be named like a counter, and the counter shares the record's hash tag (its
// Cluster slot).
const failuresSuffix = ":failures"

// recordFailureScript adds one failure to the hash KEYS[1] (fields n: the
// count, h: the payload digest it belongs to) and renews its expiry. A
// failure with another digest starts the count again at 1.
//
//	ARGV[1] payload hash (hex), ARGV[2] expiry in ms
var recordFailureScript = redis.NewScript(`
local n = 1
if redis.call('HGET', KEYS[1], 'h') == ARGV[1] then
  n = redis.call('HINCRBY', KEYS[1], 'n', 1)
else
  redis.call('HSET', KEYS[1], 'h', ARGV[1], 'n', 1)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return n
`)

// FailuresKey returns the name of the Redis key that counts the handler
// failures of key in scope: RedisKey(scope, key) + ":failures".
func (s *Store) FailuresKey(scope, key string) string {
	return s.RedisKey(scope, key) + failuresSuffix
}

// RecordFailure implements dedupdriver.Common: one atomic script on a key
// of its own, so it neither touches the lease nor needs its token. The count
// expires Config.FailureRetention after the last failure and then starts
// again at 1, as it does for another payload digest.
func (s leaseDriver) RecordFailure(ctx context.Context, scope string, rec dedup.Record) (int, error) {
	if rec.Key == "" {
		return 0, fmt.Errorf("redisdedup: record failure: %w: empty key", ErrInvalidArgument)
	}
	ms := (s.cfg.FailureRetention.Microseconds() + 999) / 1000
	n, err := recordFailureScript.Run(ctx, s.rdb, []string{s.FailuresKey(scope, rec.Key)}, rec.PayloadHash.String(), ms).Int()
	s.reloadOn(err)
	if err != nil {
		return 0, fmt.Errorf("redisdedup: record failure of %q: %w", rec.Key, err)
	}
	return n, nil
}

// ForgetFailures implements dedupdriver.Common: it deletes the failure
// count of key in scope.
func (s leaseDriver) ForgetFailures(ctx context.Context, scope, key string) error {
	if err := s.rdb.Del(ctx, s.FailuresKey(scope, key)).Err(); err != nil {
		s.reloadOn(err)
		return fmt.Errorf("redisdedup: forget failures of %q: %w", key, err)
	}
	return nil
}
