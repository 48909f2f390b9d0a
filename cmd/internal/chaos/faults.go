package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup/redisdedup"
)

// The node faults a scenario can fire. Each runs services.sh (the one of
// the module the suite runs in, see servicesScript) once, at a random
// moment among the worker kills.
const (
	// faultKafkaNode SIGKILLs one node of the kafka-cluster profile and
	// starts it again after nodeDownFor.
	faultKafkaNode = "kafka-node"
	// faultRedisMaster SIGKILLs the Redis Cluster master that owns the
	// slot of one of the run's keys, waits until a replica took its slots
	// over and starts the node again (it rejoins as a replica).
	faultRedisMaster = "redis-master"
	// faultRabbitMQRestart restarts RabbitMQ (services.sh restart).
	faultRabbitMQRestart = "rabbitmq-restart"
	// faultPostgresRestart restarts PostgreSQL (services.sh restart).
	faultPostgresRestart = "postgres-restart"
)

// allFaults lists the node faults in the order of -dry-run-faults' help.
var allFaults = []string{faultKafkaNode, faultRedisMaster, faultRabbitMQRestart, faultPostgresRestart}

// scenarioFaults are the node faults of each scenario when node faults are
// on. PostgreSQL restarts once per run, in the SQS scenario.
var scenarioFaults = map[string][]string{
	"kafka": {faultKafkaNode},
	"sqs":   {faultPostgresRestart},
	"amqp":  {faultRabbitMQRestart},
	"lease": {faultRedisMaster},
}

// nodeDownFor is how long a SIGKILLed cluster node stays down before it is
// started again.
const nodeDownFor = 4 * time.Second

// failoverWithin bounds the wait for a Redis Cluster replica to take over
// the slots of a killed master (cluster-node-timeout is 2 s).
const failoverWithin = time.Minute

// faults runs the node faults: services.sh, or, for the faults named in
// dry, a line saying what would have run.
type faults struct {
	script string
	dry    map[string]bool
	// mu serializes the faults: one node is down at a time.
	mu sync.Mutex
}

// newFaults locates services.sh, unless script names the script to run
// instead. dry lists the faults that only print their commands.
func newFaults(script string, dry []string) (*faults, error) {
	f := &faults{dry: map[string]bool{}}
	for _, d := range dry {
		if d == "" {
			continue
		}
		if !slices.Contains(allFaults, d) {
			return nil, fmt.Errorf("unknown node fault %q (known: %s)", d, strings.Join(allFaults, ", "))
		}
		f.dry[d] = true
	}
	if script == "" {
		var err error
		if script, err = servicesScript(); err != nil {
			return nil, err
		}
	}
	f.script = script
	return f, nil
}

// services runs "services.sh command node" for fault, or only prints it
// when fault is a dry run.
func (f *faults) services(ctx context.Context, fault, command, node string) error {
	if f.dry[fault] {
		fmt.Printf("chaos: %s (dry run): would run services.sh %s %s\n", fault, command, node)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", f.script, command, node)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("services.sh %s %s: %w\n%s", command, node, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// faultEvent is what one node fault did, its times counted from the start
// of the scenario's fault phase.
type faultEvent struct {
	fault string
	node  string
	verb  string        // "killed" or "restarted"
	down  time.Duration // when the node was killed or its restart began
	// failover is when a replica had taken over (redis-master), or zero.
	failover time.Duration
	back     time.Duration // when the node answered again
	dry      bool
	err      error
}

// String is, for example, "kafka-cluster-2 killed 9.1s, back 14.3s".
func (e faultEvent) String() string {
	var b strings.Builder
	b.WriteString(e.node)
	b.WriteString(" " + e.verb + " " + e.down.Round(100*time.Millisecond).String())
	if e.failover > 0 {
		b.WriteString(", failover " + e.failover.Round(100*time.Millisecond).String())
	}
	if e.back > 0 {
		b.WriteString(", back " + e.back.Round(100*time.Millisecond).String())
	}
	if e.dry {
		b.WriteString(" (dry run)")
	}
	if e.err != nil {
		b.WriteString(" (failed)")
	}
	return b.String()
}

// fire runs one node fault of s and returns what it did. It blocks until the
// node is back. rng picks the node; it is fire's own, as fire runs beside
// the kills.
func (f *faults) fire(ctx context.Context, s *scenario, fault string, rng *rand.Rand) faultEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := faultEvent{fault: fault, dry: f.dry[fault]}
	since := func() time.Duration { return time.Since(s.phaseStart) }
	defer s.outageBegins()()
	switch fault {
	case faultKafkaNode:
		ev.node, ev.verb = fmt.Sprintf("kafka-cluster-%d", 1+rng.IntN(3)), "killed"
		ev.down = since()
		if ev.err = f.services(ctx, fault, "kill", ev.node); ev.err != nil {
			return ev
		}
		sleep(ctx, nodeDownFor)
		ev.err = f.services(ctx, fault, "start", ev.node)
	case faultRedisMaster:
		node, slot, err := s.redisMasterOfRunKey(ctx, rng)
		if err != nil {
			ev.node, ev.err = "redis-cluster", err
			return ev
		}
		ev.node, ev.verb = node, "killed"
		ev.down = since()
		if ev.err = f.services(ctx, fault, "kill", ev.node); ev.err != nil {
			return ev
		}
		if !ev.dry {
			if ev.err = waitFailover(ctx, s.redisAddrs, slot, s.redisNodeAddr(node)); ev.err != nil {
				return ev
			}
			ev.failover = since()
		}
		sleep(ctx, nodeDownFor)
		ev.err = f.services(ctx, fault, "start", ev.node)
	case faultRabbitMQRestart, faultPostgresRestart:
		ev.node, ev.verb = "rabbitmq", "restarted"
		if fault == faultPostgresRestart {
			ev.node = "postgres"
		}
		ev.down = since()
		ev.err = f.services(ctx, fault, "restart", ev.node)
	default:
		ev.err = fmt.Errorf("unknown node fault %q", fault)
		return ev
	}
	if ev.err == nil {
		ev.back = since()
	}
	return ev
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// redisClusterAddrs is the Redis Cluster's node addresses, node i+1 of the
// services script at index i.
func redisClusterAddrs() []string {
	return strings.Split(envOr("TEST_REDIS_CLUSTER_ADDRS", "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005,127.0.0.1:7006"), ",")
}

// redisClusterNode is the services script's name of Redis Cluster node i
// (from 1).
func redisClusterNode(i int) string { return fmt.Sprintf("redis-cluster-%d", i) }

// servicesScript returns testdata/services/services.sh of the idemq module
// the suite builds against (the programs module's replace points at it),
// found as the suite builds its worker: with the go command in the working
// directory.
func servicesScript() (string, error) {
	out, err := exec.Command(envOr("GO", "go"), "list", "-m", "-f", "{{.Dir}}", "github.com/idemq/idemq").Output()
	if err != nil {
		return "", fmt.Errorf("find services.sh: go list -m github.com/idemq/idemq: %w", err)
	}
	root := strings.TrimSpace(string(out))
	if root == "" {
		return "", errors.New("find services.sh: the idemq module has no directory (run from the programs module)")
	}
	script := filepath.Join(root, "testdata", "services", "services.sh")
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("find services.sh: %w", err)
	}
	return script, nil
}

// redisNodeAddr is the address of the services script's node name.
func (s *scenario) redisNodeAddr(node string) string {
	for i, a := range s.redisAddrs {
		if redisClusterNode(i+1) == node {
			return a
		}
	}
	return ""
}

// redisMasterOfRunKey returns the services script's name of the Redis
// Cluster master that owns the slot of one of the run's items (chosen at
// random), and that slot.
func (s *scenario) redisMasterOfRunKey(ctx context.Context, rng *rand.Rand) (string, int64, error) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.redisAddrs})
	defer rdb.Close()
	store, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		return "", 0, err
	}
	key := store.RedisKey(s.name(), itemKey(s.runID, rng.IntN(s.mode.items)))
	slot, err := rdb.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return "", 0, fmt.Errorf("slot of %s: %w", key, err)
	}
	master, err := slotMaster(ctx, s.redisAddrs, slot, "")
	if err != nil {
		return "", 0, err
	}
	for i, a := range s.redisAddrs {
		if sameAddr(a, master) {
			return redisClusterNode(i + 1), slot, nil
		}
	}
	return "", 0, fmt.Errorf("the master of slot %d, %s, is no node of the services script (%s)", slot, master, strings.Join(s.redisAddrs, ","))
}

// slotMaster asks the nodes other than skip, in turn, which node serves
// slot as master.
func slotMaster(ctx context.Context, addrs []string, slot int64, skip string) (string, error) {
	var errs []error
	for _, a := range addrs {
		if sameAddr(a, skip) {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: a, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1})
		// CLUSTER SLOTS names a slot's owner as the cluster sees it, the
		// killed master until a replica has taken its slots over, which is
		// the moment waitFailover waits for; CLUSTER SHARDS, its successor,
		// reports roles and health per node instead.
		slots, err := c.ClusterSlots(ctx).Result() //nolint:staticcheck // see above
		_ = c.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				return r.Nodes[0].Addr, nil
			}
		}
	}
	return "", fmt.Errorf("no node names the master of slot %d: %w", slot, errors.Join(errs...))
}

// waitFailover waits until a node other than dead serves slot as master,
// as every node that answers sees it.
func waitFailover(ctx context.Context, addrs []string, slot int64, dead string) error {
	deadline := time.Now().Add(failoverWithin)
	for {
		m, err := slotMaster(ctx, addrs, slot, dead)
		if err == nil && !sameAddr(m, dead) {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("slot %d: no master found %s after its master was killed: %w", slot, failoverWithin, err)
			}
			return fmt.Errorf("slot %d still served by %s %s after its master was killed", slot, m, failoverWithin)
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// sameAddr reports whether two host:port addresses are the same, treating
// "localhost" and 127.0.0.1 alike.
func sameAddr(a, b string) bool {
	norm := func(s string) string {
		h, p, err := net.SplitHostPort(s)
		if err != nil {
			return s
		}
		if h == "localhost" || h == "" {
			h = "127.0.0.1"
		}
		return net.JoinHostPort(h, p)
	}
	return a != "" && b != "" && norm(a) == norm(b)
}

// itemKey is the key of item n of a run.
func itemKey(runID string, n int) string { return fmt.Sprintf("item-%s-%05d", runID, n) }

// poisonKey is the key of poison message n of a run.
func poisonKey(runID string, n int) string { return fmt.Sprintf("poison-%s-%d", runID, n) }
