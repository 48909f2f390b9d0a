package redisdedup

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/cfgerr"
)

// DefaultPrefix is Config.Prefix's default: the start of the name of every
// Redis key the store writes, as operators see them in Redis.
const DefaultPrefix = "idemq:"

// Sentinel errors of the store. Match them with errors.Is.
var (
	// ErrInvalidArgument is matched by the errors of calls with an empty
	// key or token, a non-positive duration or an oversized result. Such a
	// call does not reach Redis.
	ErrInvalidArgument = errors.New("redisdedup: invalid argument")
)

// Config configures a Store. The zero value is usable.
type Config struct {
	// Prefix starts the name of every Redis key the store writes, so that
	// several applications can share one Redis. It must not contain '{' or
	// '}': the store's own hash tag follows it. Defaults to "idemq:".
	Prefix string

	// MaxResultBytes is the largest result CompleteWithResult accepts: a
	// hard limit of the store, checked before anything reaches Redis. A
	// larger result fails with an error matching dedup.ErrResultTooLarge
	// (consumer.ErrResultTooLarge) and ErrInvalidArgument, and nothing is
	// stored by that call; the runner then marks the key done without the
	// result and dead-letters the message, as for a result over its own
	// consumer.Config.MaxResultBytes. Results live in Redis memory for the
	// whole retention: set it below the runner's limit to keep them
	// smaller. Defaults to 65536 (64 KiB), the runner's default limit.
	MaxResultBytes int

	// FailureRetention is how long a key's handler-failure count (see
	// RecordFailure) is kept after its last failure. Keep it at least as
	// long as LeaseOptions.Retention and the broker's redelivery horizon.
	// Defaults to dedup.DefaultRetention.
	FailureRetention time.Duration

	// RequireDurable makes Durability fail, and so a Runner refuse to start
	// (Run returns the error, a *idemq.ConfigError matching
	// dedup.ErrNotDurable), when Redis can lose a record it acknowledged:
	// the append-only file off or appendfsync other than always, on any
	// master of a Cluster, or settings that could not be read (CONFIG
	// disabled or renamed, as on some managed services, or denied by an
	// ACL). A lost record is a processed key forgotten: its next delivery
	// runs the handler again. Defaults to false: the Runner logs one WARN
	// with the loss, reports it in Health.StoreLoss and runs.
	RequireDurable bool
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Prefix = cmp.Or(c.Prefix, DefaultPrefix)
	// The runner's default consumer.Config.MaxResultBytes, so that the
	// runner's is the one limit a user meets.
	c.MaxResultBytes = cmp.Or(c.MaxResultBytes, 64<<10)
	c.FailureRetention = cmp.Or(c.FailureRetention, dedup.DefaultRetention)
	return c
}

// validate reports every invalid field of c.
func (c Config) validate() error {
	l := cfgerr.List{Prefix: "redisdedup.Config."}
	if strings.ContainsAny(c.Prefix, "{}") {
		l.Addf("Prefix", "%q contains '{' or '}'", c.Prefix)
	}
	if c.MaxResultBytes < 0 {
		l.Add("MaxResultBytes", "must not be negative")
	}
	if c.FailureRetention < time.Millisecond {
		l.Addf("FailureRetention", "%s is below 1ms", c.FailureRetention)
	}
	return l.Err()
}

// Store is the Redis store of the lease path: hand it to consumer.Leased,
// which drives it through its Driver (dedupdriver.Lease). It is safe for concurrent use by
// multiple goroutines and by many processes sharing one Redis: every
// operation is a single atomic script on one key.
type Store struct {
	rdb redis.UniversalClient
	cfg Config
}

// New returns a Store that keeps its records in rdb: a *redis.Client, a
// Sentinel failover client or a *redis.ClusterClient. It validates cfg after
// WithDefaults and does not contact Redis. The caller keeps ownership of rdb
// and closes it after the last use of the Store.
func New(rdb redis.UniversalClient, cfg Config) (*Store, error) {
	var l cfgerr.List
	if rdb == nil {
		l.Include(&idemq.ConfigError{Field: "redisdedup.New(rdb)", Reason: "nil Redis client"})
	}
	cfg = cfg.WithDefaults()
	l.Include(cfg.validate())
	if err := l.Err(); err != nil {
		return nil, err
	}
	return &Store{rdb: rdb, cfg: cfg}, nil
}

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// Claim takes the lease on rec.Key in scope for token, for the given
// duration (rounded up to a whole millisecond), if the key is neither held
// nor done. It reports:
//
//   - StateNew: token now holds the lease. A repeated Claim by the token that
//     already holds the lease extends it and reports StateNew again.
//   - StateDone: the key was completed with the same payload digest.
//   - StateMismatch: the key is held or done with a different payload
//     digest, which Claim.StoredHash carries.
//   - StateInProgress: another token holds a live lease.
//
// Claim.ProcessedAt is the completion time for StateDone, the time of the
// holder's claim for StateInProgress, and the time of whichever applies for
// StateMismatch (server clock, millisecond precision).
func (s *Store) Claim(ctx context.Context, scope string, rec dedup.Record, token string, lease time.Duration) (dedup.Claim, error) {
	ms, err := checkArgs(rec.Key, token, "lease", lease)
	if err != nil {
		return dedup.Claim{}, fmt.Errorf("redisdedup: claim: %w", err)
	}
	res, err := claimScript.Run(ctx, s.rdb, []string{s.RedisKey(scope, rec.Key)}, token, rec.PayloadHash.String(), ms).Slice()
	s.reloadOn(err)
	if err != nil {
		return dedup.Claim{}, fmt.Errorf("redisdedup: claim %q: %w", rec.Key, err)
	}
	return parseClaim(rec.Key, res)
}

// parseClaim converts the reply of claimScript.
func parseClaim(key string, res []any) (dedup.Claim, error) {
	if len(res) != 4 && len(res) != 5 {
		return dedup.Claim{}, fmt.Errorf("redisdedup: claim %q: unexpected reply %v", key, res)
	}
	state, _ := res[0].(string)
	storedHex, _ := res[1].(string)
	at, _ := res[2].(int64)

	c := dedup.Claim{Key: key}
	switch state {
	case "new":
		c.State = dedup.StateNew
		return c, nil
	case "done":
		c.State = dedup.StateDone
		if len(res) == 5 {
			if r, ok := res[4].(string); ok {
				c.Result = []byte(r)
			}
		}
	case "mismatch":
		c.State = dedup.StateMismatch
	case "busy":
		c.State = dedup.StateInProgress
	default:
		return dedup.Claim{}, fmt.Errorf("redisdedup: claim %q: unexpected state %q", key, state)
	}
	var err error
	if c.StoredHash, err = parseHash(storedHex); err != nil {
		return dedup.Claim{}, fmt.Errorf("redisdedup: claim %q: %w", key, err)
	}
	if at > 0 {
		c.ProcessedAt = time.UnixMilli(at)
	}
	return c, nil
}

// Refresh extends the lease token holds on key to the given duration from
// now. It returns an error matching dedup.ErrLeaseLost when token no longer
// holds the key (the lease expired, was released, or the key is done).
func (s *Store) Refresh(ctx context.Context, scope, key, token string, lease time.Duration) error {
	ms, err := checkArgs(key, token, "lease", lease)
	if err != nil {
		return fmt.Errorf("redisdedup: refresh: %w", err)
	}
	return s.runHeld(ctx, "refresh", refreshScript, scope, key, token, ms)
}

// runHeld runs script, for op, on the record of key, for a token that
// must hold it: the script returns 1 when it does, and anything else makes
// an error matching dedup.ErrLeaseLost.
func (s *Store) runHeld(ctx context.Context, op string, script *redis.Script, scope, key string, args ...any) error {
	n, err := script.Run(ctx, s.rdb, []string{s.RedisKey(scope, key)}, args...).Int64()
	s.reloadOn(err)
	if err != nil {
		return fmt.Errorf("redisdedup: %s %q: %w", op, key, err)
	}
	if n != 1 {
		return fmt.Errorf("redisdedup: %s %q: %w", op, key, dedup.ErrLeaseLost)
	}
	return nil
}

// Complete marks key done under token and keeps the record for retention
// (rounded up to a whole millisecond). It returns an error matching
// dedup.ErrLeaseLost when token does not hold the key; the effect's outcome
// must then be treated as unknown. Completing a key token already completed
// succeeds again without changing it.
func (s *Store) Complete(ctx context.Context, scope, key, token string, retention time.Duration) error {
	return s.complete(ctx, scope, key, token, retention, "0")
}

// CompleteWithResult is Complete that also stores result (at most
// Config.MaxResultBytes, 64 KiB by default) with the record, for Claim's
// Claim.Result (and Inspect's Entry.Result) to return to later deliveries of the key: a
// downstream id, a status, a response. Larger results fail with an error
// matching both ErrInvalidArgument and dedup.ErrResultTooLarge before
// reaching Redis, and the key stays held by token. It implements
// dedupdriver.Lease.
func (s *Store) CompleteWithResult(ctx context.Context, scope, key, token string, retention time.Duration, result []byte) error {
	if len(result) > s.cfg.MaxResultBytes {
		return fmt.Errorf("redisdedup: complete %q: %w: %w: result has %d bytes, limit %d",
			key, ErrInvalidArgument, dedup.ErrResultTooLarge, len(result), s.cfg.MaxResultBytes)
	}
	return s.complete(ctx, scope, key, token, retention, "1", result)
}

// complete runs completeScript with its arguments after the retention:
// "0", or "1" and the result.
func (s *Store) complete(ctx context.Context, scope, key, token string, retention time.Duration, result ...any) error {
	ms, err := checkArgs(key, token, "retention", retention)
	if err != nil {
		return fmt.Errorf("redisdedup: complete: %w", err)
	}
	return s.runHeld(ctx, "complete", completeScript, scope, key, append([]any{token, ms}, result...)...)
}

// Abandon deletes the lease token holds on key after a failed effect, so
// that a retry can claim the key at once. If token does not hold the key
// (its lease expired, another token holds it, or it is done), Abandon changes
// nothing and returns nil.
func (s *Store) Abandon(ctx context.Context, scope, key, token string) error {
	if key == "" || token == "" {
		return fmt.Errorf("redisdedup: abandon: %w: empty key or token", ErrInvalidArgument)
	}
	if err := abandonScript.Run(ctx, s.rdb, []string{s.RedisKey(scope, key)}, token).Err(); err != nil {
		s.reloadOn(err)
		return fmt.Errorf("redisdedup: abandon %q: %w", key, err)
	}
	return nil
}

// Inspect returns what the store holds for key in scope: the payload digest,
// whether a lease is in progress (and until when), when the key was claimed
// or completed, and when the record expires. It returns an error matching
// dedup.ErrNotFound if the key is neither held nor done.
func (s *Store) Inspect(ctx context.Context, scope, key string) (dedup.Entry, error) {
	res, err := inspectScript.Run(ctx, s.rdb, []string{s.RedisKey(scope, key)}).Slice()
	s.reloadOn(err)
	if errors.Is(err, redis.Nil) {
		return dedup.Entry{}, fmt.Errorf("redisdedup: inspect %q: %w", key, dedup.ErrNotFound)
	}
	if err != nil {
		return dedup.Entry{}, fmt.Errorf("redisdedup: inspect %q: %w", key, err)
	}
	if len(res) != 6 && len(res) != 7 {
		return dedup.Entry{}, fmt.Errorf("redisdedup: inspect %q: unexpected reply %v", key, res)
	}
	state, _ := res[0].(string)
	storedHex, _ := res[1].(string)
	claimed, _ := res[2].(int64)
	done, _ := res[3].(int64)
	ttl, _ := res[4].(int64)
	now, _ := res[5].(int64)

	e := dedup.Entry{Scope: scope, Key: key}
	if len(res) == 7 {
		if r, ok := res[6].(string); ok {
			e.Result = []byte(r)
		}
	}
	if e.PayloadHash, err = parseHash(storedHex); err != nil {
		return dedup.Entry{}, fmt.Errorf("redisdedup: inspect %q: %w", key, err)
	}
	var expires time.Time
	if ttl >= 0 {
		expires = time.UnixMilli(now + ttl)
	}
	switch state {
	case "p":
		e.InProgress = true
		e.ProcessedAt = time.UnixMilli(claimed)
		e.LeaseUntil = expires
		e.ExpiresAt = expires
	case "d":
		e.ProcessedAt = time.UnixMilli(done)
		e.ExpiresAt = expires
	default:
		return dedup.Entry{}, fmt.Errorf("redisdedup: inspect %q: unexpected state %q", key, state)
	}
	return e, nil
}

// RedisKey returns the name of the Redis hash that holds key in scope, for
// operators inspecting Redis by hand (see the package documentation for its
// layout). The name embeds a Cluster hash tag covering scope and key.
func (s *Store) RedisKey(scope, key string) string {
	if !strings.ContainsAny(scope, "%:{}") && !strings.ContainsAny(key, "%}") {
		// Nothing to escape (the usual case): one allocation.
		return s.cfg.Prefix + "{" + scope + ":" + key + "}"
	}
	var b strings.Builder
	b.Grow(len(s.cfg.Prefix) + len(scope) + len(key) + 3)
	b.WriteString(s.cfg.Prefix)
	b.WriteByte('{')
	_, _ = scopeEscaper.WriteString(&b, scope) // strings.Builder never fails
	b.WriteByte(':')
	_, _ = keyEscaper.WriteString(&b, key)
	b.WriteByte('}')
	return b.String()
}

// The escaped scope contains no ':', so the first ':' after '{' ends it; the
// escaped key contains no '}', so the hash tag spans scope and key. '%' is
// escaped in both, which makes the encoding injective.
var (
	scopeEscaper = strings.NewReplacer("%", "%25", ":", "%3A", "{", "%7B", "}", "%7D")
	keyEscaper   = strings.NewReplacer("%", "%25", "}", "%7D")
)

// checkArgs validates the common arguments and converts d to milliseconds,
// rounding up.
func checkArgs(key, token, what string, d time.Duration) (int64, error) {
	switch {
	case key == "":
		return 0, fmt.Errorf("%w: empty key", ErrInvalidArgument)
	case token == "":
		return 0, fmt.Errorf("%w: empty token", ErrInvalidArgument)
	case d <= 0:
		return 0, fmt.Errorf("%w: %s %v is not positive", ErrInvalidArgument, what, d)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond), nil
}

func parseHash(s string) (dedup.Hash, error) {
	b, err := hex.DecodeString(s)
	if err != nil {
		return dedup.Hash{}, fmt.Errorf("stored payload hash %q: %w", s, err)
	}
	return dedup.HashFromBytes(b)
}

// reloadOn asks a Cluster client to reload its slot map after a call failed
// for a reason other than the caller's context. go-redis reloads it on its
// own only on MOVED and READONLY replies and every
// ClusterStateReloadInterval (60 s by default): while a failed master's
// replica takes over, commands keep going to the dead address, so leases
// could not be refreshed and expire. The reload is lazy and rate-limited by
// go-redis; on other clients this does nothing.
func (s *Store) reloadOn(err error) {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return
	}
	if c, ok := s.rdb.(*redis.ClusterClient); ok {
		c.ReloadState(context.Background())
	}
}
