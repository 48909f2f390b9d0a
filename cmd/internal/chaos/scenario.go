package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/redisdedup"
)

// databaseEnv hands a worker its PostgreSQL URL (see cmd/internal/chaos/worker).
const databaseEnv = "CHAOS_DATABASE_URL"

// handlerWork is the time each handler call of the workers takes, inside
// its transaction: batches last long enough for kills to land inside them.
const handlerWork = 5 * time.Millisecond

// leaseFor is the lease path's lease (consumer.LeaseOptions.Lease): a
// killed worker's keys come back after it; refreshed every third of it, it
// outlasts a Redis Cluster failover (about 4 s here).
const leaseFor = 10 * time.Second

// aimFor bounds how long a kill waits, after its gap, for a worker with
// messages in flight to kill.
const aimFor = 500 * time.Millisecond

// result is what one scenario measured.
type result struct {
	kind                  string
	workers               int
	sent, resends, poison int
	kills                 int
	// killsInFlight counts the kills of a worker that reported messages
	// received and not settled: kills inside a batch.
	killsInFlight int
	// killsInRebalance counts, on Kafka, the kills while some worker had
	// not joined the group yet: the group was rebalancing.
	killsInRebalance        int
	pgKills, pgBackends     int
	lives                   report // the counters of every life, added
	effects, missing, extra int
	deadLettered            int // distinct poison keys in the dead-letter destination
	converged, total        time.Duration
	failures                []string
	selfExits               int // workers that exited although nobody killed them
	// refusedStarts counts the workers that exited before their runner
	// started, started while a node fault had a service down: the service
	// refused them at start-up (amqpsource.New connects), as it would
	// refuse a supervisor's restart. They are restarted, and no failure.
	refusedStarts int
	// events are the node faults fired, in order.
	events []faultEvent
	// sendRetries counts the producer's chunks sent again after an error
	// (a broker node down): producer re-sends too.
	sendRetries int
	// requests is, on the lease path, the webhook requests the receiver
	// got; requests - effects were repeats of an applied key, which the
	// key closed (the lease window).
	requests int
	// afterDone counts, on the lease path, the requests of a key already
	// done in the lease store, outside a failover's window (a failure);
	// afterDoneInWindow those within a lease of a failover; unchecked the
	// requests the store could not be asked about.
	afterDone, afterDoneInWindow, unchecked int
}

func (r *result) fail(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func (r result) verdict() string {
	if len(r.failures) > 0 {
		return "FAIL"
	}
	return "ok"
}

// rebalances is the number of group generations the workers' lives
// joined, on Kafka; "-" elsewhere.
func (r result) rebalances() string {
	if r.kind != "kafka" {
		return "-"
	}
	return strconv.FormatInt(r.lives.Rebalances, 10)
}

// repeats is, on the lease path, the requests of a key already applied,
// "-" elsewhere.
func (r result) repeats() string {
	if r.kind != "lease" {
		return "-"
	}
	col := strconv.Itoa(r.requests - r.effects)
	if n := r.afterDone + r.afterDoneInWindow; n > 0 {
		col += fmt.Sprintf(" (%d after done)", n)
	}
	return col
}

// faultsCol lists the node faults fired, "-" when none.
func (r result) faultsCol() string {
	if len(r.events) == 0 {
		return "-"
	}
	var parts []string
	for _, e := range r.events {
		parts = append(parts, e.String())
	}
	col := strings.Join(parts, "; ")
	if r.refusedStarts > 0 {
		col += fmt.Sprintf(" (%d worker starts refused meanwhile)", r.refusedStarts)
	}
	return col
}

// killsInRebalanceCol is killsInRebalance on Kafka, "-" elsewhere.
func (r result) killsInRebalanceCol() string {
	if r.kind != "kafka" {
		return "-"
	}
	return strconv.Itoa(r.killsInRebalance)
}

// scenario runs one broker's chaos.
type scenario struct {
	kind    string
	mode    mode
	bin     string
	runID   string
	dbURL   string
	verbose bool
	// faults fires the node faults named in nodeFaults; nil when node
	// faults are off.
	faults     *faults
	nodeFaults []string

	pool       *pgxpool.Pool
	recv       *receiver            // the lease path's downstream
	rdb        *redis.ClusterClient // the receiver's look into the lease store
	lease      *redisdedup.Store
	redisAddrs []string
	phaseStart time.Time // the start of the fault phase
	// outages are the node faults' spans, from the kill or restart of the
	// node until it answered again; a zero to is one still going on.
	outagesMu sync.Mutex
	outages   []outage
	schema    string
	b         broker
	rng       *rand.Rand
	slots     []*proc
	res       result
}

// name is the run's topic, queue and group name of the scenario.
func (s *scenario) name() string { return "idemq-chaos-" + s.runID + "-" + s.kind }

// app is the PostgreSQL application_name of worker slot i.
func (s *scenario) app(i int) string { return fmt.Sprintf("chaos-%s-%s-w%d", s.runID, s.kind, i) }

func (s *scenario) run(ctx context.Context) result {
	began := time.Now()
	s.res = result{kind: s.kind, workers: s.mode.workers, poison: s.mode.poison}
	s.rng = rand.New(rand.NewPCG(uint64(began.UnixNano()), 0xc4a05))
	err := s.setup(ctx)
	if err != nil {
		s.res.fail("setup: %v", err)
	} else {
		if err := s.chaos(ctx); err != nil {
			s.res.fail("%v", err)
		}
		s.stopWorkers()
		s.verify(ctx)
	}
	if len(s.res.failures) > 0 && os.Getenv("CHAOS_KEEP") == "1" {
		s.stopWorkers()
		fmt.Printf("chaos: %s: failed; CHAOS_KEEP=1 keeps its destination %s and schema %s for inspection\n", s.kind, s.name(), s.schema)
	} else {
		s.cleanup()
	}
	s.res.total = time.Since(began)
	return s.res
}

// setup creates the schema (the effects table and the dedup tables) and the
// broker's destinations.
func (s *scenario) setup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(s.dbURL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "idemq-chaos"
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	s.schema = strings.ReplaceAll("chaos_"+s.runID+"_"+s.kind, "-", "_")
	ident := pgx.Identifier{s.schema}.Sanitize()
	if _, err := s.pool.Exec(ctx, `CREATE SCHEMA `+ident); err != nil {
		return err
	}
	// No unique constraint: a duplicate effect must show, not fail.
	if _, err := s.pool.Exec(ctx, `CREATE TABLE `+ident+`.effects (
		id bigserial PRIMARY KEY, key text NOT NULL, n int NOT NULL, worker text NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	store, err := pgdedup.New(s.pool, pgdedup.Config{Schema: s.schema})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	if s.kind == "lease" {
		s.redisAddrs = redisClusterAddrs()
		s.rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.redisAddrs, ReadTimeout: time.Second, WriteTimeout: time.Second})
		if s.lease, err = redisdedup.New(s.rdb, redisdedup.Config{}); err != nil {
			return err
		}
		done := func(ctx context.Context, key string) (bool, error) {
			e, err := s.lease.Inspect(ctx, s.name(), key)
			if errors.Is(err, dedup.ErrNotFound) {
				return false, nil
			}
			return err == nil && !e.InProgress, err
		}
		if s.recv, err = startReceiver(s.name(), done); err != nil {
			return err
		}
	}
	if s.b, err = newBroker(s.kind, s.name(), slices.Contains(s.nodeFaults, faultKafkaNode)); err != nil {
		return err
	}
	if err := s.b.setup(ctx); err != nil {
		if slices.Contains(s.nodeFaults, faultKafkaNode) {
			return fmt.Errorf("%w (the kafka-node fault runs Kafka on the kafka-cluster profile: services.sh up kafka-cluster, or -node-faults=false)", err)
		}
		return err
	}
	return nil
}

// cleanup deletes the destinations and the schema.
func (s *scenario) cleanup() {
	for _, p := range s.slots {
		if p != nil {
			p.kill()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s.recv != nil {
		s.recv.close()
	}
	if s.rdb != nil {
		s.deleteLeaseKeys(ctx)
		_ = s.rdb.Close()
	}
	if s.b != nil {
		s.b.cleanup(ctx)
	}
	if s.pool != nil {
		if s.schema != "" {
			if _, err := s.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{s.schema}.Sanitize()+` CASCADE`); err != nil {
				fmt.Printf("chaos: drop schema %s: %v\n", s.schema, err)
			}
		}
		s.pool.Close()
	}
}

// start starts (or restarts) the worker of slot i.
func (s *scenario) start(i int) error {
	args := append(s.b.workerArgs(), "-schema", s.schema, "-app", s.app(i), "-work", handlerWork.String(), fmt.Sprintf("-v=%v", s.verbose))
	if s.recv != nil {
		args = append(args, "-store", "redis-cluster", "-webhook", s.recv.url, "-lease", leaseFor.String())
	}
	p, err := startProc(s.bin, args, []string{databaseEnv + "=" + s.dbURL})
	if err != nil {
		return err
	}
	s.slots[i] = p
	return nil
}

// retire adds the counters of slot i's ended life, and notes an exit that
// was no SIGKILL of ours.
func (s *scenario) retire(i int, killed bool) {
	p := s.slots[i]
	<-p.done
	s.res.lives.add(p.report())
	if !killed || !p.killed() {
		s.selfExit(i, p)
	}
}

// selfExit notes that the worker of slot i exited although nobody killed
// it: the first three in full, then a count. A worker that never started its
// runner, started while a node fault had a service down, was refused at
// start-up: counted apart.
func (s *scenario) selfExit(i int, p *proc) {
	if !p.reported() && s.duringOutage(p.started) {
		s.res.refusedStarts++
		return
	}
	s.res.selfExits++
	if s.res.selfExits <= 3 {
		s.res.fail("worker %d (pid %d) exited by itself: %v\n%s", i, p.pid(), p.err, p.stderr.String())
	}
}

// messages returns the items (each once, about 10 % a second time, as a
// producer that retries) and the poison messages, shuffled.
func (s *scenario) messages() []outMsg {
	var msgs []outMsg
	for n := range s.mode.items {
		m := outMsg{Key: itemKey(s.runID, n), Body: []byte(fmt.Sprintf(`{"n":%d}`, n))}
		msgs = append(msgs, m)
		if s.rng.Float64() < 0.1 {
			msgs = append(msgs, m)
			s.res.resends++
		}
	}
	for n := range s.mode.poison {
		msgs = append(msgs, outMsg{Key: poisonKey(s.runID, n), Body: []byte(`{"n":` + strconv.Itoa(n) + `, not json`)})
	}
	s.rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	return msgs
}

// chaos starts the workers and the producer, and kills workers and
// database backends until the mode's kills are done and everything was
// sent. Then it waits until the effects and the dead letters converged.
func (s *scenario) chaos(ctx context.Context) error {
	// The first worker declares what the workers declare (RabbitMQ's
	// quorum queue) alone: RabbitMQ may fail a consume on a quorum queue
	// whose replica has not started yet with INTERNAL_ERROR, and three
	// workers declaring a fresh queue at once hit that.
	s.slots = make([]*proc, s.mode.workers)
	if err := s.start(0); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for !s.b.ready(ctx) {
		if time.Now().After(deadline) {
			return errors.New("the first worker did not declare the queue within 1 min")
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := 1; i < len(s.slots); i++ {
		if err := s.start(i); err != nil {
			return err
		}
	}

	// The producer spreads its messages over the kill phase.
	msgs := s.messages()
	s.res.sent = len(msgs)
	kills := s.mode.kills[s.kind]
	gaps := s.mode.gaps[s.kind]
	phase := time.Duration(kills) * (gaps[0] + gaps[1]) / 2
	chunks := max(1, len(msgs)/50)
	pause := phase / time.Duration(chunks)
	s.phaseStart = time.Now()
	var (
		wg      sync.WaitGroup
		sendErr error
	)
	produced := make(chan struct{})
	wg.Go(func() {
		defer close(produced)
		for c := range chunks {
			lo, hi := c*len(msgs)/chunks, (c+1)*len(msgs)/chunks
			if err := s.send(ctx, msgs[lo:hi]); err != nil {
				sendErr = fmt.Errorf("send: %w", err)
				return
			}
			select {
			case <-ctx.Done():
				sendErr = ctx.Err()
				return
			case <-time.After(pause):
			}
		}
	})
	defer wg.Wait()

	// Each node fault fires once, after a random kill in the first 60 %
	// of them (after the first 20 %), and runs beside the kills.
	var (
		faultsWG sync.WaitGroup
		eventsMu sync.Mutex
	)
	fireAt := map[int][]string{}
	if s.faults != nil {
		for _, f := range s.nodeFaults {
			k := kills/5 + 1 + s.rng.IntN(max(1, 2*kills/5))
			fireAt[k] = append(fireAt[k], f)
		}
	}
	defer faultsWG.Wait()

	nextPG := 1
	for k := 1; k <= kills; k++ {
		gap := gaps[0] + time.Duration(s.rng.Int64N(int64(gaps[1]-gaps[0])+1))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(gap):
		}
		for _, f := range fireAt[k] {
			rng := rand.New(rand.NewPCG(s.rng.Uint64(), s.rng.Uint64()))
			faultsWG.Go(func() {
				ev := s.faults.fire(ctx, s, f, rng)
				eventsMu.Lock()
				s.res.events = append(s.res.events, ev)
				eventsMu.Unlock()
				fmt.Printf("chaos: %s: %s: %s\n", s.kind, f, ev)
			})
		}
		s.restartExited()
		i := s.victim(ctx)
		if s.slots[i].report().InFlight > 0 {
			s.res.killsInFlight++
		}
		if s.kind == "kafka" && slices.ContainsFunc(s.slots, func(p *proc) bool { return p.report().Rebalances == 0 }) {
			s.res.killsInRebalance++
		}
		s.slots[i].kill()
		s.retire(i, true)
		s.res.kills++
		if err := s.start(i); err != nil {
			return err
		}
		// The lease path's workers have no PostgreSQL backends.
		if s.kind != "lease" && nextPG <= s.mode.pgKills && k >= nextPG*kills/(s.mode.pgKills+1) {
			nextPG++
			if err := s.terminateBackends(ctx); err != nil {
				return err
			}
		}
	}
	// The node faults end (their nodes answer again) before convergence is
	// timed; the workers keep being restarted meanwhile.
	faultsDone := make(chan struct{})
	go func() { faultsWG.Wait(); close(faultsDone) }()
	for waiting := true; waiting; {
		select {
		case <-faultsDone:
			waiting = false
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
			s.restartExited()
		}
	}
	for _, ev := range s.res.events {
		if ev.err != nil {
			s.res.fail("node fault %s: %v", ev.fault, ev.err)
		}
	}
	select {
	case <-produced:
	case <-ctx.Done():
		return ctx.Err()
	}
	if sendErr != nil {
		return sendErr
	}
	return s.converge(ctx)
}

// sendFor bounds the producer's tries of one chunk: a broker node may be
// down or restarting meanwhile.
const sendFor = 3 * time.Minute

// send sends msgs, and again after an error until sendFor has passed: the
// messages of a failed try may have arrived, so a try again is a
// producer's re-send, which the workers must absorb.
func (s *scenario) send(ctx context.Context, msgs []outMsg) error {
	deadline := time.Now().Add(sendFor)
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := s.b.send(sctx, msgs)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		s.res.sendRetries++
		sleep(ctx, time.Second)
	}
}

// victim returns the slot to kill: one whose worker reports messages in
// flight (a kill inside a batch), waiting up to aimFor for one, else a
// random one.
func (s *scenario) victim(ctx context.Context) int {
	deadline := time.Now().Add(aimFor)
	for {
		busy := []int{}
		for i, p := range s.slots {
			if p.report().InFlight > 0 {
				busy = append(busy, i)
			}
		}
		if len(busy) > 0 {
			return busy[s.rng.IntN(len(busy))]
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return s.rng.IntN(len(s.slots))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// restartExited restarts the workers that exited by themselves.
func (s *scenario) restartExited() {
	for i, p := range s.slots {
		if p.exited() {
			s.retire(i, false)
			_ = s.start(i)
		}
	}
}

// terminateBackends terminates the PostgreSQL backends of the scenario's
// workers, wherever they are (idle, inside a batch, committing).
//
// PostgreSQL may be restarting (a node fault): it tries for up to a minute.
func (s *scenario) terminateBackends(ctx context.Context) error {
	var n int
	deadline := time.Now().Add(time.Minute)
	for {
		err := s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE $1`,
			"chaos-"+s.runID+"-"+s.kind+"-w%").Scan(&n)
		if err == nil {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("terminate backends: %w", err)
		}
		sleep(ctx, 500*time.Millisecond)
	}
	s.res.pgKills++
	s.res.pgBackends += n
	return nil
}

// counts returns the number of effects, of distinct keys among them, and
// of keys that are no item. On the lease path the effects are the keys the
// receiver applied: one each, whatever the repeats.
func (s *scenario) counts(ctx context.Context) (effects, distinct, extra int, err error) {
	if s.recv != nil {
		_, applied, extra, _ := s.recv.counts()
		return applied, applied, extra, nil
	}
	err = s.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT key), count(DISTINCT key) FILTER (WHERE key NOT LIKE 'item-%')
		FROM `+pgx.Identifier{s.schema, "effects"}.Sanitize()).Scan(&effects, &distinct, &extra)
	return effects, distinct, extra, err
}

// converge waits until every item has its effect and every poison message
// is in the dead-letter destination, restarting workers that exit.
func (s *scenario) converge(ctx context.Context) error {
	began := time.Now()
	defer func() { s.res.converged = time.Since(began) }()
	seen := map[string]int{}
	deadline := began.Add(s.mode.converge)
	for {
		s.restartExited()
		// A query or a read that fails (a node still settling after a
		// fault) is tried again until the deadline.
		_, distinct, extra, err := s.counts(ctx)
		if err == nil {
			if derr := s.b.deadLetters(ctx, seen); derr != nil {
				err = fmt.Errorf("read dead letters: %w", derr)
			}
		}
		if err != nil {
			if time.Now().After(deadline) || ctx.Err() != nil {
				return err
			}
			sleep(ctx, 500*time.Millisecond)
			continue
		}
		poison := 0
		for k := range seen {
			if strings.HasPrefix(k, "poison-") {
				poison++
			}
		}
		s.res.deadLettered = poison
		if distinct-extra >= s.mode.items && poison == s.mode.poison {
			for k := range seen {
				if !strings.HasPrefix(k, "poison-") {
					s.res.fail("item %s was dead-lettered", k)
				}
			}
			return nil
		}
		if time.Now().After(deadline) {
			var items []string
			for k := range seen {
				if !strings.HasPrefix(k, "poison-") {
					items = append(items, k)
				}
			}
			where := ""
			if d, ok := s.b.(depther); ok {
				if n, err := d.depth(ctx); err == nil {
					where = fmt.Sprintf("; %d messages ready in the queue", n)
				}
			}
			return fmt.Errorf("not converged within %s: %d of %d items have an effect, %d of %d poison messages dead-lettered, items dead-lettered %q%s",
				s.mode.converge, distinct-extra, s.mode.items, poison, s.mode.poison, items, where)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// stopWorkers sends SIGTERM to the workers, waits up to 45 s for them to
// drain, and adds their final counters.
func (s *scenario) stopWorkers() {
	for _, p := range s.slots {
		if p != nil && !p.exited() {
			_ = syscall.Kill(p.pid(), syscall.SIGTERM)
		}
	}
	deadline := time.After(45 * time.Second)
	for i, p := range s.slots {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
		case <-deadline:
			s.res.fail("worker %d (pid %d) did not stop within 45 s of SIGTERM", i, p.pid())
			p.kill()
		}
		s.res.lives.add(p.report())
		// A worker SIGTERMed before it set up its signal handler dies of
		// the signal.
		if p.err != nil && !p.killed() && !p.signaled(syscall.SIGTERM) {
			s.selfExit(i, p)
		}
		s.slots[i] = nil
	}
}

// verify checks the effects: one per item, none missing, none for poison.
func (s *scenario) verify(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	effects, distinct, extra, err := s.counts(ctx)
	if err != nil {
		s.res.fail("count effects: %v", err)
		return
	}
	s.res.effects, s.res.extra = effects, extra
	s.res.missing = s.mode.items - (distinct - extra)
	if s.recv != nil {
		var foreign []string
		s.res.requests, _, _, foreign = s.recv.counts()
		if len(foreign) > 0 {
			s.res.fail("%d webhook requests without the run's Idempotency-Key, the first %q", len(foreign), foreign[0])
		}
		// A done key's handler must not run again. A failover may lose a
		// lease not yet replicated (the window in docs/guarantees.md): a request after
		// done within a lease of the failover is that window, any other a
		// failure.
		// The check is no check if it never sees a done key. A node of the
		// cluster may be down for a moment: each key is asked for up to
		// 20 s.
		for n := range min(10, s.mode.items) {
			e, err := s.lease.Inspect(ctx, s.name(), itemKey(s.runID, n))
			for deadline := time.Now().Add(20 * time.Second); err != nil && !errors.Is(err, dedup.ErrNotFound) && time.Now().Before(deadline); {
				sleep(ctx, 500*time.Millisecond)
				e, err = s.lease.Inspect(ctx, s.name(), itemKey(s.runID, n))
			}
			if err != nil || e.InProgress {
				s.res.fail("item %s is not done in the lease store after the run (in progress %v, %v): the receiver's check after done sees nothing", itemKey(s.runID, n), e.InProgress, err)
				break
			}
		}
		afterDone, unchecked := s.recv.checks()
		s.res.unchecked = unchecked
		for _, a := range afterDone {
			if s.nearOutage(a.at, leaseFor) {
				s.res.afterDoneInWindow++
				continue
			}
			s.res.afterDone++
			if s.res.afterDone <= 3 {
				s.res.fail("item %s: a request %s into the fault phase, after the key was done", a.key, a.at.Sub(s.phaseStart).Round(time.Millisecond))
			}
		}
	}
	if effects != distinct {
		s.res.fail("%d effects for %d distinct keys: %d duplicate effects", effects, distinct, effects-distinct)
	}
	if s.res.missing != 0 {
		s.res.fail("%d items have no effect", s.res.missing)
	}
	if extra != 0 {
		s.res.fail("%d effects of keys that are no item (poison applied?)", extra)
	}
	if s.res.deadLettered != s.mode.poison {
		s.res.fail("%d of %d poison messages dead-lettered", s.res.deadLettered, s.mode.poison)
	}
}

// outage is the span of one node fault.
type outage struct{ from, to time.Time }

// outageBegins notes that a node fault took a service down now, and
// returns what ends the span.
func (s *scenario) outageBegins() (end func()) {
	s.outagesMu.Lock()
	defer s.outagesMu.Unlock()
	s.outages = append(s.outages, outage{from: time.Now()})
	i := len(s.outages) - 1
	return func() {
		s.outagesMu.Lock()
		defer s.outagesMu.Unlock()
		s.outages[i].to = time.Now()
	}
}

// nearOutage reports whether t fell inside a node fault's span widened by
// d on both sides.
func (s *scenario) nearOutage(t time.Time, d time.Duration) bool {
	s.outagesMu.Lock()
	defer s.outagesMu.Unlock()
	for _, o := range s.outages {
		if !t.Before(o.from.Add(-d)) && (o.to.IsZero() || !t.After(o.to.Add(d))) {
			return true
		}
	}
	return false
}

// duringOutage reports whether t fell inside a node fault's span.
func (s *scenario) duringOutage(t time.Time) bool {
	s.outagesMu.Lock()
	defer s.outagesMu.Unlock()
	for _, o := range s.outages {
		if !t.Before(o.from) && (o.to.IsZero() || !t.After(o.to)) {
			return true
		}
	}
	return false
}

// deleteLeaseKeys deletes the lease path's records of the run (each
// item's and poison message's key and failure count) from the Redis
// Cluster, which would keep them for the retention.
func (s *scenario) deleteLeaseKeys(ctx context.Context) {
	var keys []string
	for n := range s.mode.items {
		keys = append(keys, itemKey(s.runID, n))
	}
	for n := range s.mode.poison {
		keys = append(keys, poisonKey(s.runID, n))
	}
	pipe := s.rdb.Pipeline()
	for _, k := range keys {
		pipe.Del(ctx, s.lease.RedisKey(s.name(), k), s.lease.FailuresKey(s.name(), k))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		fmt.Printf("chaos: delete the lease records: %v\n", err)
	}
}
