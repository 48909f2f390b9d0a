package redisdedup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
)

// persistence is what one Redis server says of how it keeps writes across a
// restart: INFO persistence and, where CONFIG is allowed, CONFIG GET
// appendfsync and save.
type persistence struct {
	addr       string // the Cluster or Ring node; empty for a single client
	appendOnly bool   // INFO persistence aof_enabled
	fsync      string // appendfsync; meaningful when configErr is nil
	save       string // the RDB snapshot schedule, "" when off; likewise
	// configErr is why CONFIG GET failed: CONFIG disabled or renamed (as
	// on some managed services), or denied by an ACL.
	configErr error
}

// Durability reads the persistence settings of Redis (of every master of a
// Cluster) and says, in Durability.Loss, how a record the store wrote and
// Redis acknowledged can be lost: empty only with appendonly yes and
// appendfsync always (docs/guarantees.md#redis-durability has the table).
// When CONFIG GET is refused (disabled, renamed, denied by an ACL), it reads
// INFO persistence alone and says that appendfsync could not be read.
//
// With Config.RequireDurable, a Loss is returned with an error: a
// *idemq.ConfigError matching dedup.ErrNotDurable. Other errors are
// Redis's. The store's driver answers with it (dedupdriver.Caps.Durability):
// the Runner calls it once when Run starts.
func (s *Store) Durability(ctx context.Context) (dedup.Durability, error) {
	ps, err := s.persistence(ctx)
	if err != nil {
		err = fmt.Errorf("redisdedup: read Redis's persistence settings: %w", err)
		if s.cfg.RequireDurable {
			return dedup.Durability{}, &idemq.ConfigError{Field: "redisdedup.Config.RequireDurable",
				Reason: "cannot tell whether Redis keeps the writes it acknowledged", Err: errors.Join(dedup.ErrNotDurable, err)}
		}
		return dedup.Durability{}, err
	}
	d := describe(ps)
	if d.Loss != "" && s.cfg.RequireDurable {
		return d, &idemq.ConfigError{Field: "redisdedup.Config.RequireDurable", Reason: fmt.Sprintf(
			"Redis can lose the records it acknowledged (%s): %s; a record lost is a processed key forgotten, and its next delivery runs the handler again: set appendonly yes and appendfsync always, or unset RequireDurable to accept it",
			d.Settings, d.Loss), Err: dedup.ErrNotDurable}
	}
	return d, nil
}

// persistence reads the settings of the store's Redis: of every master of a
// Cluster, of every shard of a Ring.
func (s *Store) persistence(ctx context.Context) ([]persistence, error) {
	var (
		mu  sync.Mutex
		out []persistence
	)
	each := func(ctx context.Context, c *redis.Client) error {
		p, err := readPersistence(ctx, c)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Options().Addr, err)
		}
		p.addr = c.Options().Addr
		mu.Lock()
		out = append(out, p)
		mu.Unlock()
		return nil
	}
	var err error
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, each)
	case *redis.Ring:
		err = c.ForEachShard(ctx, each)
	default:
		var p persistence
		p, err = readPersistence(ctx, s.rdb)
		out = append(out, p)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readPersistence reads one server's settings in one round trip.
func readPersistence(ctx context.Context, c redis.Cmdable) (persistence, error) {
	var info *redis.StringCmd
	var fsync, save *redis.MapStringStringCmd
	// Not a transaction: a refused CONFIG must not take INFO with it.
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		info = p.Info(ctx, "persistence")
		fsync = p.ConfigGet(ctx, "appendfsync")
		save = p.ConfigGet(ctx, "save")
		return nil
	})
	text, err := info.Result()
	if err != nil {
		return persistence{}, fmt.Errorf("INFO persistence: %w", err)
	}
	var p persistence
	aof, ok := infoField(text, "aof_enabled")
	if !ok {
		return persistence{}, fmt.Errorf("INFO persistence: no aof_enabled field in %q", text)
	}
	p.appendOnly = aof == "1"
	f, ferr := fsync.Result()
	sv, serr := save.Result()
	switch {
	case ferr != nil:
		p.configErr = ferr
	case serr != nil:
		p.configErr = serr
	case f["appendfsync"] == "":
		p.configErr = errors.New("CONFIG GET appendfsync returned nothing")
	default:
		p.fsync, p.save = f["appendfsync"], sv["save"]
	}
	if p.configErr != nil {
		p.configErr = fmt.Errorf("CONFIG GET: %w", p.configErr)
	}
	return p, nil
}

// infoField returns the value of name in the text of an INFO reply.
func infoField(text, name string) (string, bool) {
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// settings formats p's settings as Redis names them.
func (p persistence) settings() string {
	s := "appendonly=no"
	if p.appendOnly {
		s = "appendonly=yes"
	}
	if p.configErr != nil {
		s += " appendfsync=? save=? (" + p.configErr.Error() + ")"
	} else {
		s += " appendfsync=" + p.fsync + " save=" + strconv.Quote(p.save)
	}
	if p.addr != "" {
		s = p.addr + ": " + s
	}
	return s
}

// loss says how a write p acknowledged can be lost, or "".
func (p persistence) loss() string {
	switch {
	case !p.appendOnly && p.configErr != nil:
		return "the append-only file is off: a restart or crash of Redis loses the records written since its last RDB snapshot, all of them without snapshots (the schedule could not be read)"
	case !p.appendOnly && p.save == "":
		return "the append-only file and RDB snapshots are off: a restart of Redis loses every record"
	case !p.appendOnly:
		return "the append-only file is off: a crash of Redis, or a restart without a final snapshot, loses the records written since its last RDB snapshot"
	case p.configErr != nil:
		return "appendfsync could not be read: unless it is always, a crash of Redis's machine (power loss, kernel panic) loses the records of the last second or more"
	case p.fsync == "always":
		return ""
	case p.fsync == "everysec":
		return "appendfsync is everysec: a crash of Redis's machine (power loss, kernel panic) loses the records of about the last second, or two when the disk is slow"
	default:
		return "appendfsync is " + p.fsync + ": a crash of Redis's machine (power loss, kernel panic) loses the records the kernel had not written to disk yet (typically up to 30 s)"
	}
}

// describe sums up the settings of one or more servers.
func describe(ps []persistence) dedup.Durability {
	var settings, losses []string
	for _, p := range ps {
		settings = append(settings, p.settings())
		if l := p.loss(); l != "" {
			if p.addr != "" {
				l = p.addr + ": " + l
			}
			losses = append(losses, l)
		}
	}
	return dedup.Durability{Settings: strings.Join(settings, "; "), Loss: strings.Join(losses, "; ")}
}
