// Command kafkasession measures what kafkasource's consumer-group session
// settings cost and buy, against a real Kafka broker:
//
//   - resume after a kill: two worker processes share a group on a topic
//     that a producer writes to continuously; one is SIGKILLed (it cannot
//     leave the group), and the time until the survivor receives from every
//     partition the dead worker owned is measured. It is about
//     SessionTimeout plus one rebalance.
//   - false rebalances under load: two workers with CPU burners in their
//     processes (and the producer at a higher rate) run for a while without
//     any member leaving or joining; every rebalance they see is a false
//     one, a member evicted because its heartbeats were late.
//
// Each setting is a SessionTimeout/HeartbeatInterval pair. The program runs
// itself as the workers (-worker). Bounded: every wait has a deadline.
//
//	go -C cmd/internal run ./bench/kafkasession
//	go -C cmd/internal run ./bench/kafkasession -settings 30s/3s,10s/1s,6s/500ms -kills 3 -load 60s
//
// TEST_KAFKA_BROKERS selects another broker.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/sources/kafkasource"
)

func main() {
	var (
		brokers    = flag.String("brokers", envOr("TEST_KAFKA_BROKERS", "127.0.0.1:9092"), "comma-separated Kafka bootstrap brokers")
		settings   = flag.String("settings", "30s/3s,10s/1s,6s/500ms", "comma-separated SessionTimeout/HeartbeatInterval pairs")
		partitions = flag.Int("partitions", 4, "partitions of each test topic")
		kills      = flag.Int("kills", 3, "kills measured per setting")
		load       = flag.Duration("load", 60*time.Second, "how long the false-rebalance run lasts per setting (0 skips it)")
		burn       = flag.Int("burn", 2, "CPU-burning goroutines in each worker during the load run")
		pauses     = flag.String("pauses", "2s,5s,8s", "comma-separated stalls (SIGSTOP … SIGCONT) of one worker, each checked for a rebalance (empty skips)")
		worker     = flag.Bool("worker", false, "internal: run as a worker process")
		topic      = flag.String("topic", "", "internal: the worker's topic")
		group      = flag.String("group", "", "internal: the worker's group")
		session    = flag.Duration("session", 0, "internal: the worker's SessionTimeout")
		heartbeat  = flag.Duration("heartbeat", 0, "internal: the worker's HeartbeatInterval")
	)
	flag.Parse()
	bs := strings.Split(*brokers, ",")
	if *worker {
		if err := runWorker(bs, *topic, *group, *session, *heartbeat, *burn); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		return
	}
	var pairs [][2]time.Duration
	for _, s := range strings.Split(*settings, ",") {
		a, b, ok := strings.Cut(s, "/")
		st, err1 := time.ParseDuration(a)
		hb, err2 := time.ParseDuration(b)
		if !ok || err1 != nil || err2 != nil {
			fatal(fmt.Errorf("bad setting %q, want SessionTimeout/HeartbeatInterval", s))
		}
		pairs = append(pairs, [2]time.Duration{st, hb})
	}
	fmt.Printf("kafkasession: %d partitions, %d kills per setting, load run %s with %d burners per worker\n", *partitions, *kills, *load, *burn)
	for _, p := range pairs {
		var resumes []time.Duration
		for i := range *kills {
			d, err := measureKill(bs, *partitions, p[0], p[1])
			if err != nil {
				fmt.Printf("session %-5s heartbeat %-6s kill %d: %v\n", p[0], p[1], i+1, err)
				continue
			}
			resumes = append(resumes, d)
			fmt.Printf("session %-5s heartbeat %-6s kill %d: partitions resumed on the survivor after %s\n", p[0], p[1], i+1, d.Round(10*time.Millisecond))
		}
		line := fmt.Sprintf("session %-5s heartbeat %-6s resume after kill: %s", p[0], p[1], summary(resumes))
		if *load > 0 {
			n, err := measureFalseRebalances(bs, *partitions, p[0], p[1], *load, *burn)
			if err != nil {
				line += fmt.Sprintf("; false rebalances: %v", err)
			} else {
				line += fmt.Sprintf("; false rebalances in %s under load: %d", *load, n)
			}
		}
		if *pauses != "" {
			var ds []time.Duration
			for _, v := range strings.Split(*pauses, ",") {
				d, err := time.ParseDuration(v)
				if err != nil {
					fatal(fmt.Errorf("bad pause %q", v))
				}
				ds = append(ds, d)
			}
			res, err := measurePauses(bs, *partitions, p[0], p[1], ds)
			if err != nil {
				line += fmt.Sprintf("; stalls: %v", err)
			} else {
				line += "; stalls: " + res
			}
		}
		fmt.Println("RESULT " + line)
	}
}

func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no measurement"
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return fmt.Sprintf("min %s, mean %s, max %s (n=%d)", ds[0].Round(10*time.Millisecond),
		(sum / time.Duration(len(ds))).Round(10*time.Millisecond), ds[len(ds)-1].Round(10*time.Millisecond), len(ds))
}

// receipt is one line of a worker: a message of partition received at t, or
// its rebalance counter.
type receipt struct {
	partition  int
	t          time.Time
	rebalances int64 // -1 for message lines
}

// child is a worker process and what it reported.
type child struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	last map[int]time.Time // partition → last receipt
	got  []receipt
	reb  int64
	done chan struct{}
}

func startChild(brokers []string, topic, group string, session, heartbeat time.Duration, burn int) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-worker", "-brokers", strings.Join(brokers, ","), "-topic", topic, "-group", group,
		"-session", session.String(), "-heartbeat", heartbeat.String(), "-burn", strconv.Itoa(burn))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, last: map[int]time.Time{}, done: make(chan struct{})}
	go c.read(out)
	return c, nil
}

func (c *child) read(r io.Reader) {
	defer close(c.done)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		now := time.Now()
		c.mu.Lock()
		switch f[0] {
		case "M":
			c.last[int(n)] = now
			c.got = append(c.got, receipt{partition: int(n), t: now, rebalances: -1})
		case "R":
			c.reb = n
		}
		c.mu.Unlock()
	}
}

// owned returns the partitions c received from within the last window.
func (c *child) owned(window time.Duration) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ps []int
	for p, t := range c.last {
		if time.Since(t) < window {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

func (c *child) rebalances() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reb
}

// firstAfter returns when c first received from partition p after t.
func (c *child) firstAfter(p int, t time.Time) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.got {
		if r.partition == p && r.t.After(t) {
			return r.t, true
		}
	}
	return time.Time{}, false
}

func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	_ = c.cmd.Wait()
}

// stable waits until both children receive from a disjoint, complete set of
// partitions for settle in a row.
func stable(a, b *child, partitions int, settle, timeout time.Duration) ([]int, []int, error) {
	deadline := time.Now().Add(timeout)
	var since time.Time
	var pa, pb []int
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		na, nb := a.owned(time.Second), b.owned(time.Second)
		ok := len(na) > 0 && len(nb) > 0 && len(na)+len(nb) == partitions
		for _, p := range na {
			if slices.Contains(nb, p) {
				ok = false
			}
		}
		if !ok || !slices.Equal(na, pa) || !slices.Equal(nb, pb) {
			since, pa, pb = time.Time{}, na, nb
			continue
		}
		if since.IsZero() {
			since = time.Now()
		}
		if time.Since(since) >= settle {
			return pa, pb, nil
		}
	}
	return nil, nil, fmt.Errorf("the group did not settle on two members within %s (last: %v / %v)", timeout, pa, pb)
}

func measureKill(brokers []string, partitions int, session, heartbeat time.Duration) (time.Duration, error) {
	topic, group := unique("idemq-session"), unique("idemq-session-group")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic, Partitions: partitions}); err != nil {
		return 0, err
	}
	defer deleteTopic(brokers, topic)
	go produce(ctx, brokers, topic, partitions, 25*time.Millisecond)

	a, err := startChild(brokers, topic, group, session, heartbeat, 0)
	if err != nil {
		return 0, err
	}
	defer func() { _ = a.cmd.Process.Kill(); <-a.done; _ = a.cmd.Wait() }()
	b, err := startChild(brokers, topic, group, session, heartbeat, 0)
	if err != nil {
		return 0, err
	}
	defer b.stop()
	victim, _, err := stable(a, b, partitions, 3*time.Second, 3*session+time.Minute)
	if err != nil {
		return 0, err
	}
	killed := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return 0, err
	}
	deadline := killed.Add(3*session + time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		var last time.Time
		all := true
		for _, p := range victim {
			t, ok := b.firstAfter(p, killed)
			if !ok {
				all = false
				break
			}
			if t.After(last) {
				last = t
			}
		}
		if all {
			return last.Sub(killed), nil
		}
	}
	return 0, fmt.Errorf("partitions %v did not resume on the survivor within %s", victim, deadline.Sub(killed))
}

func measureFalseRebalances(brokers []string, partitions int, session, heartbeat, load time.Duration, burn int) (int64, error) {
	topic, group := unique("idemq-session"), unique("idemq-session-group")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic, Partitions: partitions}); err != nil {
		return 0, err
	}
	defer deleteTopic(brokers, topic)
	go produce(ctx, brokers, topic, partitions, 2*time.Millisecond)

	a, err := startChild(brokers, topic, group, session, heartbeat, burn)
	if err != nil {
		return 0, err
	}
	defer a.stop()
	b, err := startChild(brokers, topic, group, session, heartbeat, burn)
	if err != nil {
		return 0, err
	}
	defer b.stop()
	if _, _, err := stable(a, b, partitions, 3*time.Second, 3*session+time.Minute); err != nil {
		return 0, err
	}
	time.Sleep(1500 * time.Millisecond) // a fresh rebalance counter line from each
	ra, rb := a.rebalances(), b.rebalances()
	time.Sleep(load)
	return max(a.rebalances()-ra, b.rebalances()-rb), nil
}

// measurePauses stops one worker (SIGSTOP) for each pause, as a long GC
// pause, a CPU-starved container or a frozen VM would, resumes it, and
// reports for each whether the group rebalanced (the member was evicted).
func measurePauses(brokers []string, partitions int, session, heartbeat time.Duration, pauses []time.Duration) (string, error) {
	topic, group := unique("idemq-session"), unique("idemq-session-group")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic, Partitions: partitions}); err != nil {
		return "", err
	}
	defer deleteTopic(brokers, topic)
	go produce(ctx, brokers, topic, partitions, 25*time.Millisecond)
	a, err := startChild(brokers, topic, group, session, heartbeat, 0)
	if err != nil {
		return "", err
	}
	defer a.stop()
	b, err := startChild(brokers, topic, group, session, heartbeat, 0)
	if err != nil {
		return "", err
	}
	defer b.stop()
	var out []string
	for _, d := range pauses {
		if _, _, err := stable(a, b, partitions, 3*time.Second, 3*session+time.Minute); err != nil {
			return strings.Join(out, ", "), err
		}
		time.Sleep(1500 * time.Millisecond)
		rb := b.rebalances()
		if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return "", err
		}
		time.Sleep(d)
		if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			return "", err
		}
		time.Sleep(2*heartbeat + 3*time.Second)
		verdict := "kept"
		if b.rebalances() > rb {
			verdict = "rebalanced"
		}
		out = append(out, fmt.Sprintf("%s %s", d, verdict))
	}
	return strings.Join(out, ", "), nil
}

// produce writes one message to every partition each tick until ctx ends.
func produce(ctx context.Context, brokers []string, topic string, partitions int, tick time.Duration) {
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.RoundRobin{}, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireOne}
	defer w.Close()
	t := time.NewTicker(tick)
	defer t.Stop()
	msgs := make([]kafka.Message, partitions)
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for p := range msgs {
			msgs[p] = kafka.Message{Value: []byte(strconv.Itoa(i)), Headers: []kafka.Header{{Key: kafkasource.DefaultKeyHeader, Value: fmt.Appendf(nil, "%d-%d", i, p)}}}
		}
		_ = w.WriteMessages(ctx, msgs...)
	}
}

// runWorker consumes with kafkasource and reports every message's partition
// ("M <partition>") and, every second, its rebalance counter
// ("R <rebalances>"). burn goroutines spin on the CPU meanwhile.
func runWorker(brokers []string, topic, group string, session, heartbeat time.Duration, burn int) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	src, err := kafkasource.New(ctx, kafkasource.Config{
		Brokers: brokers, Topics: []string{topic}, GroupID: group,
		SessionTimeout: session, HeartbeatInterval: heartbeat,
		JoinGroupBackoff: 500 * time.Millisecond, MaxWait: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return err
	}
	defer src.Close()
	for range burn {
		go func() {
			x := 0
			for ctx.Err() == nil {
				for i := range 1 << 20 {
					x += i
				}
				_ = make([]byte, 64<<10) // garbage for the collector too
			}
			_ = x
		}()
	}
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for ctx.Err() == nil {
			<-t.C
			mu.Lock()
			fmt.Fprintf(out, "R %d\n", src.Stats().Rebalances)
			_ = out.Flush()
			mu.Unlock()
		}
	}()
	for {
		msgs, err := src.Receive(ctx, 100)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// The broker restarted (other tests restart it): keep trying.
			fmt.Fprintln(os.Stderr, "worker: receive:", err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		mu.Lock()
		for _, m := range msgs {
			// ID is topic/partition/offset.
			parts := strings.Split(m.ID, "/")
			if len(parts) >= 3 {
				fmt.Fprintf(out, "M %s\n", parts[len(parts)-2])
			}
		}
		_ = out.Flush()
		mu.Unlock()
		if err := src.Ack(ctx, msgs); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "ack:", err)
		}
	}
}

func deleteTopic(brokers []string, topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.DeleteTopics(ctx, nil, brokers, topic); err != nil {
		fmt.Fprintln(os.Stderr, "kafkasession:", err)
	}
}

func unique(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "kafkasession:", err)
	os.Exit(1)
}
