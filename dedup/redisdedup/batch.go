package redisdedup

import (
	"context"
	"errors"
	"fmt"
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
	if len(recs) != len(tokens) {
		return nil, fmt.Errorf("redisdedup: claim batch: %w: %d records, %d tokens", ErrInvalidArgument, len(recs), len(tokens))
	}
	args := make([][]any, len(recs))
	keys := make([]string, len(recs))
	for i, rec := range recs {
		ms, err := checkArgs(rec.Key, tokens[i], "lease", lease)
		if err != nil {
			return nil, fmt.Errorf("redisdedup: claim batch: %w", err)
		}
		keys[i] = s.RedisKey(scope, rec.Key)
		args[i] = []any{tokens[i], rec.PayloadHash.String(), ms}
	}
	cmds, err := s.pipeline(ctx, claimScript, keys, args)
	if err != nil {
		return nil, fmt.Errorf("redisdedup: claim batch of %d: %w", len(recs), err)
	}
	claims := make([]dedup.Claim, len(recs))
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil {
			return nil, fmt.Errorf("redisdedup: claim %q: %w", recs[i].Key, err)
		}
		if claims[i], err = parseClaim(recs[i].Key, res); err != nil {
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
	if len(keys) != len(tokens) {
		return nil, fmt.Errorf("redisdedup: complete batch: %w: %d keys, %d tokens", ErrInvalidArgument, len(keys), len(tokens))
	}
	names := make([]string, len(keys))
	args := make([][]any, len(keys))
	for i, key := range keys {
		ms, err := checkArgs(key, tokens[i], "retention", retention)
		if err != nil {
			return nil, fmt.Errorf("redisdedup: complete batch: %w", err)
		}
		names[i] = s.RedisKey(scope, key)
		args[i] = []any{tokens[i], ms, "0"}
	}
	cmds, err := s.pipeline(ctx, completeScript, names, args)
	if err != nil {
		return nil, fmt.Errorf("redisdedup: complete batch of %d: %w", len(keys), err)
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
		noScript := false
		for _, cmd := range cmds {
			if isNoScript(cmd.Err()) {
				noScript = true
				break
			}
		}
		if !noScript || try > 0 {
			if err != nil && !errors.Is(err, redis.Nil) && !hasCmdErr(cmds, err) {
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

// hasCmdErr reports whether err, returned by Pipelined, is the error of one
// of the commands (reported per command) rather than a failure of the
// pipeline as a whole.
func hasCmdErr(cmds []*redis.Cmd, err error) bool {
	for _, cmd := range cmds {
		if errors.Is(err, cmd.Err()) {
			return true
		}
	}
	return false
}
