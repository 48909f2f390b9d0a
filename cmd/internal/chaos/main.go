// Command chaos is the project's chaos suite: for each broker (Kafka, SQS on
// the ElasticMQ emulator, RabbitMQ) it builds the worker of
// cmd/internal/chaos/worker, a consumer written from the public API as a user
// would, runs several of its processes against one PostgreSQL store
// (dedup/pgdedup), produces items with about 10 % producer re-sends (same
// key) and a few poison messages (a body that is not JSON), SIGKILLs workers
// at random moments and restarts them, and terminates the workers'
// PostgreSQL backends a few times. A fourth scenario, lease, runs the lease
// path: the workers consume from SQS with consumer.Leased and
// dedup/redisdedup on the Redis Cluster, and their effect is a webhook call
// (sinks/webhook) to a receiver in the suite's process that applies each
// Idempotency-Key once and counts the repeats, as the lease rows of docs/guarantees.md
// promise: a repeat (the lease window) is possible and closed by the key; a
// request for a key the lease store already holds as done is not, except
// within one lease of a failover, which may lose a record not yet
// replicated. Then it checks, from the database (the receiver on the
// lease path) and the dead-letter destination, that every item has exactly
// one effect, that none is missing and that every poison message was
// dead-lettered, and prints a table: kills, rebalances seen, duplicates
// absorbed, effects, window repeats, time to converge, node faults. It exits
// 1 when a scenario fails.
//
// Node faults (on in both modes; -node-faults=false turns them off): each
// fires once per scenario at a random moment among the worker kills, through
// testdata/services/services.sh, while the kills go on:
//
//   - kafka: kafka-node, one node of the kafka-cluster profile SIGKILLed and
//     started again 4 s later; the Kafka scenario then runs on that
//     three-node cluster, its topics with replication factor 3;
//   - lease: redis-master, the Redis Cluster master owning one of the run's
//     keys SIGKILLed; once a replica took its slots over, the node is
//     started again and rejoins as a replica;
//   - amqp: rabbitmq-restart, services.sh restart rabbitmq;
//   - sqs: postgres-restart, services.sh restart postgres (once per run).
//
// A worker started while its service is down by a node fault, and refused
// (it exits before its runner starts), is restarted as a supervisor would,
// and counted apart, not as a failure.
//
//	make chaos                # CHAOS=short: a few minutes for the four scenarios
//	make chaos CHAOS=long     # over 1,000 process kills in total
//	go -C cmd/internal run ./chaos -brokers kafka -mode short
//	go -C cmd/internal run ./chaos -dry-run-faults rabbitmq-restart,postgres-restart
//
// The services must run (make services, with the kafka-cluster and
// redis-cluster profiles); their addresses come from the environment the
// services script prints. Every run uses topics, queues and a schema of its
// own, and deletes them at the end. The node faults restart PostgreSQL and
// RabbitMQ, which other suites may share: run it on a machine of its own
// (CI does), or name those faults in -dry-run-faults.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
)

// mode sizes a run.
type mode struct {
	items   int // distinct items per scenario
	poison  int // poison messages per scenario
	workers int // worker processes per scenario
	// kills is the number of SIGKILLs per broker.
	kills map[string]int
	// pgKills is the number of times the workers' PostgreSQL backends are
	// terminated per scenario.
	pgKills int
	// gaps bounds the random pause before each kill, per broker.
	gaps map[string][2]time.Duration
	// converge bounds the wait for every effect and dead letter after the
	// last fault.
	converge time.Duration
}

// Kafka's gaps are longer: after a kill the group rebalances when the
// session of the killed member expires (6 s) and again when its successor
// joins, and kills are meant to land inside those rebalances.
var modes = map[string]mode{
	"short": {
		items: 2000, poison: 5, workers: 3, pgKills: 3, converge: 2 * time.Minute,
		kills: map[string]int{"kafka": 20, "sqs": 30, "amqp": 30, "lease": 20},
		gaps: map[string][2]time.Duration{
			"kafka": {time.Second, 3 * time.Second},
			"sqs":   {300 * time.Millisecond, 1500 * time.Millisecond},
			"amqp":  {300 * time.Millisecond, 1500 * time.Millisecond},
			"lease": {500 * time.Millisecond, 2 * time.Second},
		},
	},
	"long": {
		items: 20000, poison: 20, workers: 3, pgKills: 20, converge: 5 * time.Minute,
		kills: map[string]int{"kafka": 300, "sqs": 360, "amqp": 360, "lease": 100},
		gaps: map[string][2]time.Duration{
			"kafka": {500 * time.Millisecond, 2500 * time.Millisecond},
			"sqs":   {200 * time.Millisecond, 1200 * time.Millisecond},
			"amqp":  {200 * time.Millisecond, 1200 * time.Millisecond},
			"lease": {500 * time.Millisecond, 2 * time.Second},
		},
	},
}

func main() {
	modeName := flag.String("mode", envOr("CHAOS", "short"), "short or long (default: $CHAOS, else short)")
	brokers := flag.String("brokers", "kafka,sqs,amqp,lease", "comma-separated scenarios to run (lease: the lease path on SQS and Redis Cluster)")
	verbose := flag.Bool("v", false, "workers log at Debug to stderr")
	nodeFaults := flag.Bool("node-faults", true, "fire the node faults: "+faultsHelp())
	dryRun := flag.String("dry-run-faults", "", "comma-separated node faults that only print their services.sh commands ("+strings.Join(allFaults, ", ")+")")
	script := flag.String("services", "", "the script the node faults run as services.sh (default: testdata/services/services.sh of the module)")
	flag.Parse()
	m, ok := modes[*modeName]
	if !ok {
		fmt.Fprintf(os.Stderr, "chaos: unknown mode %q (want short or long)\n", *modeName)
		os.Exit(2)
	}
	var f *faults
	if *nodeFaults {
		var err error
		if f, err = newFaults(*script, strings.Split(*dryRun, ",")); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			os.Exit(2)
		}
	}
	redis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, m, *modeName, strings.Split(*brokers, ","), *verbose, f))
}

// faultsHelp lists each scenario's node faults.
func faultsHelp() string {
	var parts []string
	for _, kind := range []string{"kafka", "sqs", "amqp", "lease"} {
		parts = append(parts, kind+": "+strings.Join(scenarioFaults[kind], ", "))
	}
	return strings.Join(parts, "; ")
}

// run runs the scenarios of kinds; f fires their node faults, none when f
// is nil.
func run(ctx context.Context, m mode, modeName string, kinds []string, verbose bool, f *faults) int {
	start := time.Now()
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	runID := hex.EncodeToString(id)
	faultsOn := "on"
	if f == nil {
		faultsOn = "off"
	}
	fmt.Printf("chaos: mode %s, run %s, %s, node faults %s, load average %s\n", modeName, runID, start.UTC().Format(time.RFC3339), faultsOn, loadAvg())

	dir, err := os.MkdirTemp("", "idemq-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "worker")
	build := exec.CommandContext(ctx, envOr("GO", "go"), "build", "-o", bin, "github.com/idemq/idemq/cmd/internal/chaos/worker")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: build the worker:", err)
		return 1
	}

	dbURL := envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable")
	var results []result
	for _, kind := range kinds {
		s := &scenario{kind: kind, mode: m, bin: bin, runID: runID, dbURL: dbURL, verbose: verbose}
		if _, ok := m.kills[kind]; !ok {
			fmt.Fprintf(os.Stderr, "chaos: unknown scenario %q (want kafka, sqs, amqp or lease)\n", kind)
			return 2
		}
		if f != nil {
			s.faults = f
			s.nodeFaults = scenarioFaults[kind]
		}
		r := s.run(ctx)
		results = append(results, r)
		fmt.Printf("chaos: %s done in %s: %s\n", kind, r.total.Round(time.Second), r.verdict())
		for _, f := range r.failures {
			fmt.Printf("chaos: %s: %s\n", kind, f)
		}
		if r.kind == "lease" {
			fmt.Printf("chaos: lease: %d webhook requests for %d keys; %d arrived after their key was done within %s of a failover (the window), %d outside (failures); %d not checked (the store did not answer)\n",
				r.requests, r.effects, r.afterDoneInWindow, leaseFor, r.afterDone, r.unchecked)
		}
		if r.sendRetries > 0 {
			fmt.Printf("chaos: %s: the producer sent %d chunks again after an error\n", kind, r.sendRetries)
		}
		if r.selfExits > 3 {
			fmt.Printf("chaos: %s: %d workers exited by themselves in all\n", kind, r.selfExits)
		}
		if ctx.Err() != nil {
			break
		}
	}
	fmt.Printf("\nchaos: mode %s, %s, %s in total, load average %s\n", modeName, time.Now().UTC().Format(time.RFC3339),
		time.Since(start).Round(time.Second), loadAvg())
	printTable(os.Stdout, results)
	failed := false
	for _, r := range results {
		if len(r.failures) > 0 {
			fmt.Printf("FAIL %s: %s (and %d more failures, listed above)\n", r.kind, firstLine(r.failures[0]), len(r.failures)-1)
			failed = true
		}
	}
	if failed || len(results) < len(kinds) {
		return 1
	}
	return 0
}

// firstLine is s up to its first newline.
func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}

// loadAvg is the first three fields of /proc/loadavg, or "n/a".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "n/a"
}

// printTable prints one row per scenario.
func printTable(w io.Writer, results []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tworkers\tsent\tre-sends\tpoison\tkills\tin batch\tin rebalance\tpg kills (backends)\trebalances\tduplicates absorbed\teffects\twindow repeats\tmissing\textra\tdead-lettered\tconverged in\tresult\tnode faults\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d (%d)\t%s\t%d\t%d\t%s\t%d\t%d\t%d/%d\t%s\t%s\t%s\t\n",
			r.kind, r.workers, r.sent, r.resends, r.poison, r.kills, r.killsInFlight, r.killsInRebalanceCol(), r.pgKills, r.pgBackends, r.rebalances(),
			r.lives.Duplicates, r.effects, r.repeats(), r.missing, r.extra, r.deadLettered, r.poison, r.converged.Round(100*time.Millisecond), r.verdict(), r.faultsCol())
	}
	_ = tw.Flush()
}
