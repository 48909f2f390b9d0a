package redisdedup

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
)

var _ dedup.FailureCounter = (*Store)(nil)

// failuresSuffix follows the record's Redis key in the name of its
// handler-failure counter. A record's name ends with '}', so no record can
// be named like a counter, and the counter shares the record's hash tag (its
// Cluster slot).
const failuresSuffix = ":failures"

// recordFailureScript adds one failure and renews the counter's expiry.
//
//	ARGV[1] expiry in ms
var recordFailureScript = redis.NewScript(`
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
`)

// FailuresKey returns the name of the Redis key that counts the handler
// failures of key in scope: RedisKey(scope, key) + ":failures".
func (s *Store) FailuresKey(scope, key string) string {
	return s.RedisKey(scope, key) + failuresSuffix
}

// RecordFailure implements dedup.FailureCounter: one atomic script (INCR and
// PEXPIRE) on a key of its own, so it neither touches the lease nor needs
// its token. The count expires Config.FailureRetention after the last
// failure and then starts again at 1.
func (s *Store) RecordFailure(ctx context.Context, scope, key string) (int, error) {
	if key == "" {
		return 0, fmt.Errorf("redisdedup: record failure: %w: empty key", ErrInvalidArgument)
	}
	ms := (s.cfg.FailureRetention.Microseconds() + 999) / 1000
	n, err := recordFailureScript.Run(ctx, s.rdb, []string{s.FailuresKey(scope, key)}, ms).Int()
	if err != nil {
		return 0, fmt.Errorf("redisdedup: record failure of %q: %w", key, err)
	}
	return n, nil
}
