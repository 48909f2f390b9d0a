package demo

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemq/idemq/cmd/idemq-demo/internal/checkout"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/sources/kafkasource"
)

// Run runs the demo: it sets up the broker and the store, starts a worker,
// lets the chaos producer send the orders, kills and restarts the worker
// Config.Kills times while orders are outstanding, waits until the ledger
// holds every valid order and the last worker is idle, stops it, and returns
// the Summary. It prints progress lines to Config.Out. An error means the
// run could not be carried out (setup, timeout); whether the ledger proves
// exactly-once is Summary.Check's answer.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return Summary{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	s := &supervisor{cfg: cfg, start: time.Now(), rng: rand.New(rand.NewPCG(cfg.Seed, 0xc0ffee))}
	defer s.cleanup()
	if err := s.setup(ctx); err != nil {
		return Summary{}, err
	}
	return s.run(ctx)
}

type supervisor struct {
	cfg   Config
	start time.Time
	rng   *rand.Rand

	runID    string
	topic    string
	group    string
	kafka    []string
	sqlite   string
	schema   string
	store    checkout.Store
	broker   checkout.Broker
	memory   *memsource.Broker
	cluster  *kfake.Cluster
	chain    *chain // the second hop; nil with Config.NoChain
	cleanups []func()

	sum Summary
}

func (s *supervisor) cleanup() {
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		s.cleanups[i]()
	}
}

func (s *supervisor) printf(format string, args ...any) {
	fmt.Fprintf(s.cfg.Out, "%5.1fs  "+format+"\n", append([]any{time.Since(s.start).Seconds()}, args...)...)
}

func (s *supervisor) setup(ctx context.Context) error {
	var id [4]byte
	_, _ = crand.Read(id[:])
	s.runID = hex.EncodeToString(id[:])
	s.topic, s.group = "idemq-demo-orders-"+s.runID, "idemq-demo-checkout"
	s.sum.Broker, s.sum.Store = s.cfg.Broker, s.cfg.Store

	kind := checkout.BrokerKafka
	switch s.cfg.Broker {
	case BrokerKfake:
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			return fmt.Errorf("demo: start the in-process Kafka cluster: %w", err)
		}
		s.cluster = c
		s.cleanups = append(s.cleanups, c.Close)
		s.kafka = c.ListenAddrs()
		s.sum.Broker = "kfake (in-process Kafka on " + strings.Join(s.kafka, ",") + ")"
	case BrokerKafka:
		s.kafka = s.cfg.KafkaBrokers
		s.sum.Broker = "Kafka at " + strings.Join(s.kafka, ",")
		// The run's topics are its own, like its schema.
		s.cleanups = append(s.cleanups, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = kafkasource.DeleteTopics(ctx, nil, s.kafka, s.topic, kafkasource.DeadLetterTopic(s.topic))
		})
	case BrokerMemory:
		kind = checkout.BrokerMemory
		s.memory = memsource.New(memsource.Config{VisibilityTimeout: time.Second, Seed: s.cfg.Seed})
		s.memory.Inject(memsource.Fault{Kind: memsource.Redelivered, Probability: 0.02, Times: -1})
		s.memory.Inject(memsource.Fault{Kind: memsource.ConcurrentDuplicate, Probability: 0.02, Times: -1})
		s.sum.Broker = "memsource (in-process, workers in-process)"
	}

	switch s.cfg.Store {
	case StoreSQLite:
		s.sqlite = s.cfg.SQLitePath
		if s.sqlite == "" {
			dir, err := os.MkdirTemp("", "idemq-demo-")
			if err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			s.cleanups = append(s.cleanups, func() { os.RemoveAll(dir) })
			s.sqlite = filepath.Join(dir, "checkout.db")
		}
		s.sum.Store = "SQLite " + s.sqlite
	case StorePostgres:
		s.schema = s.cfg.Schema
		if s.schema == "" {
			s.schema = "idemq_demo_" + s.runID
			s.cleanups = append(s.cleanups, func() { dropSchema(s.cfg.DatabaseURL, s.schema) })
		}
		s.sum.Store = "PostgreSQL schema " + s.schema
	}
	store, err := openStore(ctx, s.cfg.Store, s.sqlite, s.cfg.DatabaseURL, s.schema, s.cfg.Accounts)
	if err != nil {
		return fmt.Errorf("demo: open the store: %w", err)
	}
	s.store = store
	s.cleanups = append(s.cleanups, func() { store.Close() })
	if !s.cfg.NoChain {
		c, err := startChain(ctx, store, s.runID, s.cfg.Seed)
		if err != nil {
			return err
		}
		s.chain = c
		s.cleanups = append(s.cleanups, c.stop)
	}

	b, err := checkout.OpenBroker(ctx, checkout.BrokerConfig{Kind: kind, Memory: s.memory, KafkaBrokers: s.kafka,
		Topic: s.topic, Group: s.group, Partitions: 4})
	if err != nil {
		return fmt.Errorf("demo: set up the broker: %w", err)
	}
	s.broker = b
	s.cleanups = append(s.cleanups, func() { b.Close() })
	return nil
}

func dropSchema(databaseURL, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
}

// worker is one life of a worker: a child process, or a goroutine on the
// memory broker.
type worker struct {
	life int
	pid  int
	stop func(kill bool) // SIGKILL (or abrupt stop) when kill, else a graceful stop
	done chan struct{}   // closed when the worker has exited
	err  error           // why it exited, set before done is closed

	mu   sync.Mutex
	last report
}

func (w *worker) report() report {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

func (w *worker) setReport(r report) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = r
}

func (s *supervisor) options(life int) WorkerOptions {
	dropAcks := s.cfg.DropAcks
	if life > s.cfg.Kills || dropAcks < 0 { // the last life acknowledges everything
		dropAcks = 0
	}
	broker := checkout.BrokerKafka
	if s.cfg.Broker == BrokerMemory {
		broker = checkout.BrokerMemory
	}
	return WorkerOptions{
		Broker: broker, KafkaBrokers: strings.Join(s.kafka, ","), Topic: s.topic, Group: s.group,
		Store: s.cfg.Store, SQLitePath: s.sqlite, DatabaseURL: s.cfg.DatabaseURL, Schema: s.schema,
		Accounts: s.cfg.Accounts, SessionTimeout: s.cfg.SessionTimeout, DropAcks: dropAcks,
		Seed: s.cfg.Seed*1000 + uint64(life), Verbose: s.cfg.Verbose, Events: s.events(),
	}
}

// events is the destination of the charges' events, "" without the chain.
func (s *supervisor) events() string {
	if s.chain == nil {
		return ""
	}
	return s.chain.topic
}

// startWorker starts life number life.
func (s *supervisor) startWorker(ctx context.Context, life int) (*worker, error) {
	w := &worker{life: life, done: make(chan struct{})}
	o := s.options(life)
	if s.cfg.Broker == BrokerMemory {
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		w.stop = func(bool) { cancel() }
		b := &lossyBroker{Broker: s.broker, p: o.DropAcks, rng: rand.New(rand.NewPCG(o.Seed, 0x1de))}
		hook := newMetricsHook()
		go func() {
			defer close(w.done)
			_, w.err = checkout.Run(wctx, checkout.WorkerConfig{Broker: b, Store: s.store, Concurrency: 4, BatchSize: 25,
				Hooks: []consumer.Hook{hook}, ReportInterval: reportInterval, Report: func(st consumer.Stats) {
					r := report{Received: st.Received, Handled: st.Handled, Duplicates: st.Duplicates,
						Retried: st.Retried, DeadLettered: st.DeadLettered, DroppedAcks: b.dropped.Load()}
					hook.fill(&r)
					w.setReport(r)
				}})
		}()
		return w, nil
	}

	command := s.cfg.WorkerCommand
	if len(command) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("demo: find this program to start workers: %w", err)
		}
		command = []string{exe, "worker"}
	}
	cmd := exec.Command(command[0], append(command[1:len(command):len(command)], o.args()...)...)
	cmd.Env = append(append(os.Environ(), o.env()...), s.cfg.WorkerEnv...)
	cmd.SysProcAttr = childAttr()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr tailBuffer
	cmd.Stderr = &stderr
	if s.cfg.Verbose {
		cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("demo: start worker: %w", err)
	}
	w.pid = cmd.Process.Pid
	w.stop = func(kill bool) {
		if kill {
			_ = cmd.Process.Kill() // SIGKILL: no drain, no commit, no ack
		} else {
			_ = cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r report
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				w.setReport(r)
			}
		}
		if err := cmd.Wait(); err != nil {
			w.err = fmt.Errorf("%w: %w: %s", errWorkerExited, err, strings.TrimSpace(stderr.String()))
		}
	}()
	return w, nil
}

// plan is what the chaos producer sends, in order.
func (s *supervisor) plan() []checkout.Outgoing {
	run := "order-" + s.runID
	var msgs []checkout.Outgoing
	var resend []checkout.Outgoing
	bad := make(map[int]bool)
	for len(bad) < s.cfg.BadOrders {
		bad[s.rng.IntN(s.cfg.Messages)] = true
	}
	for i := range s.cfg.Messages {
		o := checkout.SampleOrder(run, i, s.cfg.Accounts)
		s.sum.ExpectedTotal += o.Amount
		m := o.Message()
		msgs = append(msgs, m)
		if s.rng.Float64() < s.cfg.DuplicateRate {
			resend = append(resend, m)
		}
		if bad[i] {
			msgs = append(msgs, checkout.Outgoing{Key: fmt.Sprintf("%s-malformed-%d", run, i),
				Body: []byte(`{"id": "` + o.ID + `", "amount": oops}`), PartitionKey: o.Account})
		}
		// A re-sent copy goes out a little later than its original.
		if len(resend) > 0 && s.rng.IntN(4) == 0 {
			msgs = append(msgs, resend[0])
			resend = resend[1:]
			s.sum.ProducerDuplicates++
		}
	}
	s.sum.ProducerDuplicates += len(resend)
	msgs = append(msgs, resend...)
	s.sum.Orders, s.sum.BadOrders, s.sum.Sent = s.cfg.Messages, s.cfg.BadOrders, len(msgs)
	return msgs
}

// produce sends msgs in chunks spread over about six seconds, so that the
// kills fall while orders are still arriving.
func (s *supervisor) produce(ctx context.Context, msgs []checkout.Outgoing, sent *int64mu) error {
	const chunks = 40
	size := max(1, (len(msgs)+chunks-1)/chunks)
	for len(msgs) > 0 {
		n := min(size, len(msgs))
		if err := s.broker.Publish(ctx, msgs[:n]...); err != nil {
			return fmt.Errorf("demo: producer: %w", err)
		}
		sent.add(n)
		msgs = msgs[n:]
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(150 * time.Millisecond):
		}
	}
	return nil
}

func (s *supervisor) run(ctx context.Context) (Summary, error) {
	msgs := s.plan()
	fmt.Fprintf(s.cfg.Out, "idemq-demo: checkout worker on %s, ledger in %s\n", s.sum.Broker, s.sum.Store)
	fmt.Fprintf(s.cfg.Out, "  %d orders, %d re-sent by the producer, %d malformed; %d worker kills; seed %d\n",
		s.sum.Orders, s.sum.ProducerDuplicates, s.sum.BadOrders, max(s.cfg.Kills, 0), s.cfg.Seed)
	if s.chain != nil {
		fmt.Fprintf(s.cfg.Out, "  then each charge's event: outbox → relay (loses %.0f%% of its row updates) → memsource → notifier (lease path) → webhook on %s\n",
			100*relayCrashRate, s.chain.recv.url)
	}
	fmt.Fprintln(s.cfg.Out)

	// Kill moments: when the ledger passes these fractions of the orders.
	// Each worker but the last is killed once the ledger passes its
	// moment and it has charged at least minProgress orders itself.
	var killAt []int64
	for k := range max(s.cfg.Kills, 0) {
		f := (float64(k) + 0.2 + 0.6*s.rng.Float64()) / float64(s.cfg.Kills+1)
		killAt = append(killAt, int64(f*float64(s.cfg.Messages)))
	}
	minProgress := int64(max(1, s.cfg.Messages/(4*(s.cfg.Kills+1))))
	var lifeStart int64

	life := 1
	w, err := s.startWorker(ctx, life)
	if err != nil {
		return s.sum, err
	}
	s.printf("worker #%d started%s", life, pidNote(w))
	var (
		sent      int64mu
		finished  []report
		unplanned int
	)
	prodErr := make(chan error, 1)
	go func() { prodErr <- s.produce(ctx, msgs, &sent) }()
	producing := true

	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Now()
	var lastReceived uint64
	quietSince := time.Now()
	for {
		select {
		case <-ctx.Done():
			w.stop(true)
			<-w.done
			s.finish(append(finished, w.report()))
			return s.sum, fmt.Errorf("demo: did not finish within %s (%d of %d orders charged): %w",
				s.cfg.Timeout, s.sum.Ledger.Orders, s.cfg.Messages, ctx.Err())
		case err := <-prodErr:
			if err != nil {
				w.stop(true)
				<-w.done
				return s.sum, err
			}
			producing = false
			s.printf("producer done: %d messages sent", sent.get())
		case <-w.done:
			// The worker ended on its own: report it and start another.
			unplanned++
			finished = append(finished, w.report())
			if unplanned > 3 {
				return s.sum, fmt.Errorf("demo: workers keep exiting: %w", w.err)
			}
			s.printf("worker #%d exited on its own (%v); restarting", w.life, w.err)
			life++
			if w, err = s.startWorker(ctx, life); err != nil {
				return s.sum, err
			}
			s.sum.Restarts++
		case now := <-tick.C:
			l, err := s.store.Ledger(ctx)
			if err != nil {
				continue // the store is busy or the context ended; try again
			}
			s.sum.Ledger = l
			if r := w.report(); r.Received != lastReceived {
				lastReceived, quietSince = r.Received, now
			}
			if len(killAt) > 0 && l.Orders >= killAt[0] && l.Orders >= lifeStart+minProgress {
				killAt = killAt[1:]
				time.Sleep(time.Duration(s.rng.IntN(100)) * time.Millisecond) // not always at a tick
				w.stop(true)
				<-w.done
				r := w.report()
				finished = append(finished, r)
				s.sum.Kills++
				if l2, err := s.store.Ledger(ctx); err == nil {
					l = l2
				}
				verb := "KILL -9"
				if w.pid == 0 {
					verb = "stop" // in-process: the runner is cancelled, not killed
				}
				s.printf("%s worker #%d%s: it saw %d deliveries and absorbed %d duplicates; %d orders charged so far",
					verb, w.life, pidNote(w), r.Received, r.Duplicates, l.Orders)
				life++
				if w, err = s.startWorker(ctx, life); err != nil {
					return s.sum, err
				}
				s.sum.Restarts++
				s.printf("worker #%d started%s", life, pidNote(w))
				lastReceived, quietSince, lifeStart = 0, now, l.Orders
				continue
			}
			if len(killAt) > 0 && l.Orders >= int64(s.cfg.Messages) {
				s.printf("every order was charged before kill %d of %d; skipping the rest", s.sum.Kills+1, s.cfg.Kills)
				killAt = nil
			}
			if now.Sub(lastPrint) >= time.Second {
				lastPrint = now
				r := w.report()
				notified := ""
				if s.chain != nil {
					notified = fmt.Sprintf("  notified %d/%d", s.chain.recv.orders(), s.cfg.Messages)
				}
				s.printf("sent %d/%d  charged %d/%d%s  worker #%d: %d deliveries, %d duplicates absorbed",
					sent.get(), s.sum.Sent, l.Orders, s.cfg.Messages, notified, w.life, r.Received, r.Duplicates)
			}
			done := !producing && len(killAt) == 0 && l.Orders >= int64(s.cfg.Messages) &&
				(s.chain == nil || s.chain.settled(ctx, s.cfg.Messages))
			if done && now.Sub(quietSince) >= time.Second {
				s.printf("every order is charged and worker #%d is idle; stopping it", w.life)
				w.stop(false)
				select {
				case <-w.done:
				case <-time.After(15 * time.Second):
					w.stop(true)
					<-w.done
				}
				if s.chain != nil {
					s.chain.finish(ctx, &s.sum)
				}
				s.finish(append(finished, w.report()))
				if err := s.countDeadLetters(ctx); err != nil {
					return s.sum, err
				}
				return s.sum, nil
			}
		}
	}
}

// finish adds up the workers' reports and reads the final ledger.
func (s *supervisor) finish(lives []report) {
	dups := map[string]uint64{}
	handler, commit := newHistogram(), newHistogram()
	for _, r := range lives {
		dups[consumer.DuplicateRedelivery.String()] += r.DupRedelivery
		dups[consumer.DuplicateConcurrent.String()] += r.DupConcurrent
		dups[consumer.DuplicateProducer.String()] += r.DupProducer
		handler.add(r.Handler)
		commit.add(r.Commit)
		s.sum.Deliveries += r.Received
		s.sum.DuplicatesAbsorbed += r.Duplicates
		s.sum.Charged += r.Handled
		s.sum.Retried += r.Retried
		s.sum.DeadLettered += r.DeadLettered
		s.sum.LostAcks += r.DroppedAcks
	}
	s.sum.Metrics = Metrics{Duplicates: dups, Handler: handler.latency(), Commit: commit.latency()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if l, err := s.store.Ledger(ctx); err == nil {
		s.sum.Ledger = l
	}
	s.sum.Elapsed = time.Since(s.start)
}

func pidNote(w *worker) string {
	if w.pid == 0 {
		return " (in-process)"
	}
	return fmt.Sprintf(" (pid %d)", w.pid)
}

// int64mu is a counter shared by the producer and the progress lines.
type int64mu struct {
	mu sync.Mutex
	n  int64
}

func (c *int64mu) add(n int) { c.mu.Lock(); c.n += int64(n); c.mu.Unlock() }
func (c *int64mu) get() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// tailBuffer keeps the last 4 KiB written to it: a worker's last words.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if t.buf.Len() > 4096 {
		t.buf.Next(t.buf.Len() - 4096)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

// countDeadLetters counts the distinct malformed orders in the dead-letter
// destination (written at least once, so copies are counted once).
func (s *supervisor) countDeadLetters(ctx context.Context) error {
	keys := make(map[string]bool)
	if s.memory != nil {
		for _, d := range s.memory.DeadLetters(s.topic) {
			keys[d.Key] = true
		}
	} else {
		dlq := kafkasource.DeadLetterTopic(s.topic)
		conn, err := kafka.DialLeader(ctx, "tcp", s.kafka[0], dlq, 0)
		if err != nil {
			return fmt.Errorf("demo: read the dead-letter topic: %w", err)
		}
		last, err := conn.ReadLastOffset()
		_ = conn.Close() // read only: the read's error is the one that counts
		if err != nil {
			return fmt.Errorf("demo: read the dead-letter topic: %w", err)
		}
		if last > 0 {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: s.kafka, Topic: dlq, Partition: 0, MaxWait: 100 * time.Millisecond})
			defer r.Close()
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			for {
				m, err := r.ReadMessage(rctx)
				if err != nil {
					return fmt.Errorf("demo: read the dead-letter topic: %w", err)
				}
				for _, h := range m.Headers {
					if h.Key == checkout.KeyHeader {
						keys[string(h.Value)] = true
					}
				}
				if m.Offset >= last-1 {
					break
				}
			}
		}
	}
	for k := range keys {
		if strings.Contains(k, "-malformed-") {
			s.sum.DeadLetterTopic++
		}
	}
	return nil
}
