package redisdedup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
)

// ClaimBatch is Claim for several keys in one round trip: the claims are
// pipelined (in a Cluster, one pipeline per node), and each is atomic on its
// own key, exactly as Claim. tokens[i] is the token of recs[i]; the claims
// come back in the order of recs.
//
// If ClaimBatch returns an error, some keys may be claimed: calling it again
// with the same tokens is safe (a claim by the holding token reports
// StateNew again), and unused leases expire.
func (s *Store) ClaimBatch(ctx context.Context, scope string, recs []dedup.Record, tokens []string, lease time.Duration) ([]dedup.Claim, error) {
	keys := make([]string, len(recs))
	for i, rec := range recs {
		keys[i] = rec.Key
	}
	cmds, err := s.runBatch(ctx, "claim", claimScript, scope, keys, tokens, "lease", lease, func(i int, ms int64) []any {
		return []any{tokens[i], recs[i].PayloadHash.String(), ms}
	})
	if err != nil {
		return nil, err
	}
	claims := make([]dedup.Claim, len(recs))
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil {
			return nil, fmt.Errorf("redisdedup: claim %q: %w", keys[i], err)
		}
		if claims[i], err = parseClaim(keys[i], res); err != nil {
			return nil, err
		}
	}
	return claims, nil
}

// CompleteBatch is Complete for several keys in one round trip. tokens[i] is
// the token of keys[i]. It returns one result per key: nil, or an error
// matching dedup.ErrLeaseLost when that token does not hold that key. A
// non-nil second result means the call as a whole failed and the outcome of
// every key is unknown; calling it again with the same tokens is safe.
func (s *Store) CompleteBatch(ctx context.Context, scope string, keys, tokens []string, retention time.Duration) ([]error, error) {
	cmds, err := s.runBatch(ctx, "complete", completeScript, scope, keys, tokens, "retention", retention, func(i int, ms int64) []any {
		return []any{tokens[i], ms, "0"}
	})
	if err != nil {
		return nil, err
	}
	results := make([]error, len(keys))
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		switch {
		case err != nil:
			return nil, fmt.Errorf("redisdedup: complete %q: %w", keys[i], err)
		case n != 1:
			results[i] = fmt.Errorf("redisdedup: complete %q: %w", keys[i], dedup.ErrLeaseLost)
		}
	}
	return results, nil
}

// runBatch checks the arguments of a batch of op, whose duration d is what,
// and runs script on the record of each key, pipelined, with the arguments
// argv returns for the key's index and d in milliseconds.
func (s *Store) runBatch(ctx context.Context, op string, script *redis.Script, scope string, keys, tokens []string, what string, d time.Duration, argv func(i int, ms int64) []any) ([]*redis.Cmd, error) {
	if len(keys) != len(tokens) {
		return nil, fmt.Errorf("redisdedup: %s batch: %w: %d keys, %d tokens", op, ErrInvalidArgument, len(keys), len(tokens))
	}
	names := make([]string, len(keys))
	args := make([][]any, len(keys))
	for i, key := range keys {
		ms, err := checkArgs(key, tokens[i], what, d)
		if err != nil {
			return nil, fmt.Errorf("redisdedup: %s batch: %w", op, err)
		}
		names[i] = s.RedisKey(scope, key)
		args[i] = argv(i, ms)
	}
	cmds, err := s.pipeline(ctx, script, names, args)
	if err != nil {
		return nil, fmt.Errorf("redisdedup: %s batch of %d: %w", op, len(keys), err)
	}
	return cmds, nil
}

// pipeline runs script once per key in one pipeline and returns the
// commands. If the server does not know the script (after a restart or
// SCRIPT FLUSH), it loads it and runs the pipeline once more: every script
// is idempotent for one token, so a repeat changes nothing.
func (s *Store) pipeline(ctx context.Context, script *redis.Script, keys []string, args [][]any) ([]*redis.Cmd, error) {
	for try := 0; ; try++ {
		cmds := make([]*redis.Cmd, len(keys))
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, key := range keys {
				cmds[i] = script.EvalSha(ctx, p, []string{key}, args[i]...)
			}
			return nil
		})
		s.reloadOn(err)
		if try > 0 || !slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return isNoScript(c.Err()) }) {
			cmdErr := slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return errors.Is(err, c.Err()) })
			if err != nil && !errors.Is(err, redis.Nil) && !cmdErr { // the pipeline's own failure
				return nil, err
			}
			return cmds, nil
		}
		if err := script.Load(ctx, s.rdb).Err(); err != nil {
			return nil, fmt.Errorf("loading script: %w", err)
		}
	}
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
