package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup/pgdedup"
)

// databaseEnv hands a worker its PostgreSQL URL (see internal/chaos/worker).
const databaseEnv = "CHAOS_DATABASE_URL"

// handlerWork is the time each handler call of the workers takes, inside
// its transaction: batches last long enough for kills to land inside them.
const handlerWork = 5 * time.Millisecond

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

	pool   *pgxpool.Pool
	schema string
	b      broker
	rng    *rand.Rand
	slots  []*proc
	res    result
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
	s.cleanup()
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
	if s.b, err = newBroker(s.kind, s.name()); err != nil {
		return err
	}
	return s.b.setup(ctx)
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
// it: the first three in full, then a count.
func (s *scenario) selfExit(i int, p *proc) {
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
		m := outMsg{Key: fmt.Sprintf("item-%s-%05d", s.runID, n), Body: []byte(fmt.Sprintf(`{"n":%d}`, n))}
		msgs = append(msgs, m)
		if s.rng.Float64() < 0.1 {
			msgs = append(msgs, m)
			s.res.resends++
		}
	}
	for n := range s.mode.poison {
		msgs = append(msgs, outMsg{Key: fmt.Sprintf("poison-%s-%d", s.runID, n), Body: []byte(`{"n":` + strconv.Itoa(n) + `, not json`)})
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
	var (
		wg      sync.WaitGroup
		sendErr error
	)
	produced := make(chan struct{})
	wg.Go(func() {
		defer close(produced)
		for c := range chunks {
			lo, hi := c*len(msgs)/chunks, (c+1)*len(msgs)/chunks
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := s.b.send(sctx, msgs[lo:hi])
			cancel()
			if err != nil {
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

	nextPG := 1
	for k := 1; k <= kills; k++ {
		gap := gaps[0] + time.Duration(s.rng.Int64N(int64(gaps[1]-gaps[0])+1))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(gap):
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
		if nextPG <= s.mode.pgKills && k >= nextPG*kills/(s.mode.pgKills+1) {
			nextPG++
			if err := s.terminateBackends(ctx); err != nil {
				return err
			}
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
func (s *scenario) terminateBackends(ctx context.Context) error {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE $1`,
		"chaos-"+s.runID+"-"+s.kind+"-w%").Scan(&n)
	if err != nil {
		return fmt.Errorf("terminate backends: %w", err)
	}
	s.res.pgKills++
	s.res.pgBackends += n
	return nil
}

// counts returns the number of effects, of distinct keys among them, and
// of keys that are no item.
func (s *scenario) counts(ctx context.Context) (effects, distinct, extra int, err error) {
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
		_, distinct, extra, err := s.counts(ctx)
		if err != nil {
			return err
		}
		if err := s.b.deadLetters(ctx, seen); err != nil {
			return fmt.Errorf("read dead letters: %w", err)
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
			return fmt.Errorf("not converged within %s: %d of %d items have an effect, %d of %d poison messages dead-lettered",
				s.mode.converge, distinct-extra, s.mode.items, poison, s.mode.poison)
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
