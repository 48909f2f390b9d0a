package demo_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/cmd/idemq-demo/internal/checkout"
	"github.com/idemq/idemq/cmd/idemq-demo/internal/demo"
	"github.com/idemq/idemq/internal/testenv"
)

// envWorker makes the test binary act as a demo worker process, so that the
// supervisor's kills hit real processes running this package's code.
const envWorker = "IDEMQ_DEMO_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(envWorker) == "1" {
		o, err := demo.ParseWorkerFlags(os.Args[1:])
		if err == nil {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
			err = demo.RunWorker(ctx, o, os.Stdout)
			stop()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runDemo runs a shortened demo with this test binary as the worker program.
func runDemo(t *testing.T, cfg demo.Config) (demo.Summary, string) {
	t.Helper()
	var out bytes.Buffer
	cfg.WorkerCommand = []string{os.Args[0]}
	cfg.WorkerEnv = []string{envWorker + "=1"}
	cfg.Out = &out
	if cfg.Timeout == 0 {
		cfg.Timeout = 90 * time.Second
	}
	sum, err := demo.Run(context.Background(), cfg)
	sum.Print(&out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	return sum, out.String()
}

// checkMetrics fails t unless the summary's metrics section is printed with
// its numbers, and, when exact (every worker life ended with a final
// report), they match the runner's counters: the duplicates by reason add up
// to the duplicates absorbed, and there is one successful commit per
// charged order.
func checkMetrics(t *testing.T, sum demo.Summary, out string, exact bool) {
	t.Helper()
	m := sum.Metrics
	var dups uint64
	for _, n := range m.Duplicates {
		dups += n
	}
	if exact && (dups != sum.DuplicatesAbsorbed || m.Commit.Count != sum.Charged) {
		t.Errorf("duplicates by reason %v add up to %d, %d absorbed; %d commits for %d charged orders",
			m.Duplicates, dups, sum.DuplicatesAbsorbed, m.Commit.Count, sum.Charged)
	}
	if m.Handler.Count < m.Commit.Count || m.Commit.Count == 0 || m.Handler.P50 <= 0 || m.Handler.P99 < m.Handler.P50 ||
		m.Commit.P50 <= 0 || m.Commit.P99 < m.Commit.P50 {
		t.Errorf("latencies: handler %+v, commit %+v", m.Handler, m.Commit)
	}
	want := []string{
		fmt.Sprintf("duplicates by reason   redelivery %d, concurrent %d, producer %d",
			m.Duplicates["redelivery"], m.Duplicates["concurrent"], m.Duplicates["producer"]),
		fmt.Sprintf("handler latency        p50 %s  p99 %s  (%d runs)", demo.FormatLatency(m.Handler.P50), demo.FormatLatency(m.Handler.P99), m.Handler.Count),
		fmt.Sprintf("commit latency         p50 %s  p99 %s  (%d commits)", demo.FormatLatency(m.Commit.P50), demo.FormatLatency(m.Commit.P99), m.Commit.Count),
	}
	for _, line := range want {
		if !strings.Contains(out, line) {
			t.Errorf("the printed summary lacks %q", line)
		}
	}
}

// checkProof fails t unless the summary proves exactly-once and the chaos
// really happened.
func checkProof(t *testing.T, sum demo.Summary, kills int) {
	t.Helper()
	if err := sum.Check(); err != nil {
		t.Fatalf("proof: %v", err)
	}
	if sum.Kills < 1 || sum.Kills > kills || sum.Restarts < sum.Kills {
		t.Fatalf("%d kills and %d restarts, want 1 to %d kills, each followed by a restart", sum.Kills, sum.Restarts, kills)
	}
	if sum.DuplicatesAbsorbed == 0 || sum.Deliveries <= uint64(sum.Orders) {
		t.Fatalf("%d deliveries and %d duplicates absorbed for %d orders: the chaos did not happen", sum.Deliveries, sum.DuplicatesAbsorbed, sum.Orders)
	}
	// The second hop: every charge's event relayed, and the notifier saw
	// and absorbed duplicates.
	if !sum.Chain || sum.EventsSent != int64(sum.Orders) || sum.EventsPending != 0 {
		t.Fatalf("chain %v: %d events relayed, %d pending, want %d and 0", sum.Chain, sum.EventsSent, sum.EventsPending, sum.Orders)
	}
	if sum.EventDuplicatesAbsorbed == 0 || sum.EventDeliveries <= uint64(sum.Orders) {
		t.Fatalf("%d event deliveries and %d duplicates absorbed for %d orders: the second hop saw no chaos", sum.EventDeliveries, sum.EventDuplicatesAbsorbed, sum.Orders)
	}
}

func TestDemoOnKfakeAndSQLite(t *testing.T) {
	sum, out := runDemo(t, demo.Config{Messages: 400, Kills: 2, Seed: 7})
	checkProof(t, sum, 2)
	checkMetrics(t, sum, out, false) // a killed worker's last report may lag
}

func TestDemoOnMemoryBroker(t *testing.T) {
	sum, out := runDemo(t, demo.Config{Broker: demo.BrokerMemory, Messages: 300, Kills: 2, Seed: 3})
	checkProof(t, sum, 2)
	checkMetrics(t, sum, out, true) // in-process workers stop with a final report
}

func TestDemoOnKafkaAndPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka and PostgreSQL")
	}
	sum, _ := runDemo(t, demo.Config{Broker: demo.BrokerKafka, KafkaBrokers: testenv.KafkaBrokers(t),
		Store: demo.StorePostgres, DatabaseURL: testenv.DatabaseURL(t), Messages: 300, Kills: 1, Seed: 5})
	checkProof(t, sum, 1)
}

// TestCheckCatchesBrokenLedgers: the proof fails for each way exactly-once
// can break, so a demo that double-charged would exit non-zero.
func TestCheckCatchesBrokenLedgers(t *testing.T) {
	good := demo.Summary{Orders: 3, ExpectedTotal: 60, BadOrders: 1, DeadLetterTopic: 1,
		Ledger: checkout.Ledger{Rows: 3, Orders: 3, Total: 60, Debited: 60}}
	if err := good.Check(); err != nil {
		t.Fatalf("good ledger: %v", err)
	}
	chained := good
	chained.Chain, chained.Notified, chained.NotifyCalls, chained.NotifiedTotal = true, 3, 3, 60
	if err := chained.Check(); err != nil {
		t.Fatalf("good ledger and notifications: %v", err)
	}
	for name, broken := range map[string]func(s *demo.Summary){
		"double charge": func(s *demo.Summary) {
			s.Ledger.Rows, s.Ledger.Total, s.Ledger.Debited, s.Ledger.DoubleCharged = 4, 80, 80, 1
		},
		"lost order":        func(s *demo.Summary) { s.Ledger.Rows, s.Ledger.Orders, s.Ledger.Total, s.Ledger.Debited = 2, 2, 40, 40 },
		"wrong amount":      func(s *demo.Summary) { s.Ledger.Total, s.Ledger.Debited = 61, 61 },
		"debit without row": func(s *demo.Summary) { s.Ledger.Debited = 70 },
		"bad order lost":    func(s *demo.Summary) { s.DeadLetterTopic = 0 },
		"order not notified": func(s *demo.Summary) {
			s.Chain, s.Notified, s.NotifyCalls, s.NotifiedTotal = true, 2, 2, 40
		},
		"order notified twice": func(s *demo.Summary) {
			s.Chain, s.Notified, s.NotifyCalls, s.NotifiedTwice, s.NotifiedTotal = true, 3, 4, 1, 60
		},
	} {
		s := good
		broken(&s)
		err := s.Check()
		if !errors.Is(err, demo.ErrProofFailed) {
			t.Errorf("%s: Check = %v, want ErrProofFailed", name, err)
		}
		var out bytes.Buffer
		s.Print(&out)
		if !strings.Contains(out.String(), "PROOF FAILED") {
			t.Errorf("%s: the printed summary does not say the proof failed:\n%s", name, out.String())
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []demo.Config{
		{Broker: "pulsar"},
		{Store: "mysql"},
		{Broker: demo.BrokerKafka},
		{Store: demo.StorePostgres},
		{Messages: -1},
		{DropAcks: 0.7},
	} {
		if _, err := demo.Run(context.Background(), cfg); !errors.Is(err, demo.ErrConfig) {
			t.Errorf("Run(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
}
