package demo

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemq/idemq/cmd/idemq-demo/internal/checkout"
	"github.com/idemq/idemq/consumer"
)

// ErrProofFailed is matched by the error of Summary.Check when the ledger does
// not show every valid order charged exactly once.
var ErrProofFailed = errors.New("demo: proof failed")

// Summary is what a demo run did and what the ledger shows.
type Summary struct {
	// Broker and Store name what the run used.
	Broker, Store string
	// Orders is the number of distinct valid orders sent; ExpectedTotal is
	// the sum of their amounts.
	Orders        int
	ExpectedTotal int64
	// Sent counts every message the producer sent: the orders, their
	// re-sent copies (ProducerDuplicates) and the malformed ones
	// (BadOrders).
	Sent, ProducerDuplicates, BadOrders int
	// Deliveries, DuplicatesAbsorbed, Charged, Retried and DeadLettered
	// add up the runner counters the worker processes reported (a killed
	// worker's last 50 ms are missing). LostAcks counts the
	// acknowledgements the workers dropped on purpose.
	Deliveries, DuplicatesAbsorbed, Charged, Retried, DeadLettered, LostAcks uint64
	// DeadLetterTopic is the number of distinct malformed orders found in
	// the dead-letter destination.
	DeadLetterTopic int
	// Kills is the number of workers killed; Restarts the number of worker
	// starts after the first.
	Kills, Restarts int
	// Metrics is what the workers' hooks saw (reported with the counters).
	Metrics Metrics
	// Ledger is read from the store at the end.
	Ledger checkout.Ledger

	// Chain is set when the run had the second hop: "order charged"
	// events published through the outbox in each charge's transaction,
	// relayed to a second broker, and sent by a notifier on the lease path
	// to a webhook receiver (see Config.NoChain). The fields below are
	// its figures.
	Chain bool
	// EventsSent and EventsPending are the outbox rows the relay marked
	// sent, and those left pending at the end.
	EventsSent, EventsPending int64
	// RelayCrashes counts the relay's batches whose row update was lost
	// after the broker confirmed them; RelayResent the rows those batches
	// held, published again with the same ids.
	RelayCrashes, RelayResent int
	// EventDeliveries and EventDuplicatesAbsorbed are the notifier's
	// runner counters.
	EventDeliveries, EventDuplicatesAbsorbed uint64
	// Notified is the number of distinct orders the webhook receiver was
	// notified of, NotifyCalls the requests it got, NotifiedTwice the
	// Idempotency-Keys it got more than once plus the orders it got under
	// more than one key, NotifiedTotal the sum of the notified orders'
	// amounts.
	Notified, NotifyCalls, NotifiedTwice int
	NotifiedTotal                        int64
	// Elapsed is the run's duration.
	Elapsed time.Duration
}

// Check returns nil when the ledger proves every valid order charged exactly
// once (as many distinct orders as sent, one row each, the expected total, no
// double charge, the accounts debited by exactly the ledger's total), every
// malformed order dead-lettered, and, with the second hop (Chain), every
// valid order notified exactly once (one request per Idempotency-Key, one
// key per order, the expected total); otherwise an error matching ErrProofFailed
// that lists what does not hold.
func (s Summary) Check() error {
	var failed []string
	l := s.Ledger
	if l.Orders != int64(s.Orders) {
		failed = append(failed, fmt.Sprintf("%d distinct orders charged, %d sent", l.Orders, s.Orders))
	}
	if l.Total != s.ExpectedTotal {
		failed = append(failed, fmt.Sprintf("charges sum to %d, the distinct orders to %d", l.Total, s.ExpectedTotal))
	}
	if l.DoubleCharged != 0 || l.Rows != l.Orders {
		failed = append(failed, fmt.Sprintf("%d orders charged more than once (%d ledger rows for %d orders)", l.DoubleCharged, l.Rows, l.Orders))
	}
	if l.Debited != l.Total {
		failed = append(failed, fmt.Sprintf("accounts debited %d, ledger total %d", l.Debited, l.Total))
	}
	if s.DeadLetterTopic != s.BadOrders {
		failed = append(failed, fmt.Sprintf("%d malformed orders in the dead-letter destination, %d sent", s.DeadLetterTopic, s.BadOrders))
	}
	if s.Chain {
		if s.Notified != s.Orders || s.NotifiedTotal != s.ExpectedTotal {
			failed = append(failed, fmt.Sprintf("%d distinct orders notified for %d sent (amounts %d, want %d)", s.Notified, s.Orders, s.NotifiedTotal, s.ExpectedTotal))
		}
		if s.NotifiedTwice != 0 {
			failed = append(failed, fmt.Sprintf("%d notifications repeated", s.NotifiedTwice))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%w: %s", ErrProofFailed, strings.Join(failed, "; "))
	}
	return nil
}

// Print writes the summary and the proof for a person to check.
func (s Summary) Print(w io.Writer) {
	mark := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAILED"
	}
	l := s.Ledger
	fmt.Fprintf(w, "\nSummary (%s, %s, %.1fs)\n", s.Broker, s.Store, s.Elapsed.Seconds())
	fmt.Fprintf(w, "  messages sent          %6d  (%d orders, %d re-sent with the same key, %d malformed)\n",
		s.Sent, s.Orders, s.ProducerDuplicates, s.BadOrders)
	fmt.Fprintf(w, "  deliveries seen        %6d  (reported by the workers every 10 ms; a killed worker's last report may lag)\n", s.Deliveries)
	fmt.Fprintf(w, "  duplicates absorbed    %6d  (acknowledged without charging again)\n", s.DuplicatesAbsorbed)
	fmt.Fprintf(w, "  acks lost on purpose   %6d  (so the broker redelivers what was charged)\n", s.LostAcks)
	fmt.Fprintf(w, "  dead-lettered          %6d  (malformed orders, found in the dead-letter topic)\n", s.DeadLetterTopic)
	fmt.Fprintf(w, "  worker kills           %6d\n", s.Kills)
	fmt.Fprintf(w, "  worker restarts        %6d\n", s.Restarts)
	if s.Chain {
		fmt.Fprintf(w, "  events relayed         %6d  (outbox rows published after their charge committed; %d left pending)\n", s.EventsSent, s.EventsPending)
		fmt.Fprintf(w, "  relay crashes          %6d  (row update lost after the broker confirmed: %d events published again)\n", s.RelayCrashes, s.RelayResent)
		fmt.Fprintf(w, "  event deliveries       %6d  (to the notifier; %d duplicates absorbed on the lease path)\n", s.EventDeliveries, s.EventDuplicatesAbsorbed)
	}
	m := s.Metrics
	fmt.Fprintf(w, "\nMetrics (from the runner's hooks, reported with the counters above)\n")
	fmt.Fprintf(w, "  duplicates by reason   redelivery %d, concurrent %d, producer %d\n",
		m.Duplicates[consumer.DuplicateRedelivery.String()], m.Duplicates[consumer.DuplicateConcurrent.String()],
		m.Duplicates[consumer.DuplicateProducer.String()])
	fmt.Fprintf(w, "  handler latency        p50 %s  p99 %s  (%d runs)\n", FormatLatency(m.Handler.P50), FormatLatency(m.Handler.P99), m.Handler.Count)
	fmt.Fprintf(w, "  commit latency         p50 %s  p99 %s  (%d commits)\n", FormatLatency(m.Commit.P50), FormatLatency(m.Commit.P99), m.Commit.Count)
	fmt.Fprintf(w, "\nProof (read from the %s ledger)\n", s.Store)
	fmt.Fprintf(w, "  distinct orders charged   %d of %d sent  %s\n", l.Orders, s.Orders, mark(l.Orders == int64(s.Orders)))
	fmt.Fprintf(w, "  sum of charges            %d = sum of distinct orders %d  %s\n", l.Total, s.ExpectedTotal, mark(l.Total == s.ExpectedTotal))
	fmt.Fprintf(w, "  orders charged twice      %d (%d ledger rows)  %s\n", l.DoubleCharged, l.Rows, mark(l.DoubleCharged == 0 && l.Rows == l.Orders))
	fmt.Fprintf(w, "  accounts debited          %d = ledger total  %s\n", l.Debited, mark(l.Debited == l.Total))
	fmt.Fprintf(w, "  malformed in dead letters %d of %d  %s\n", s.DeadLetterTopic, s.BadOrders, mark(s.DeadLetterTopic == s.BadOrders))
	if s.Chain {
		fmt.Fprintf(w, "\nProof of the second hop (read from the webhook receiver)\n")
		fmt.Fprintf(w, "  distinct orders notified  %d of %d sent  %s\n", s.Notified, s.Orders, mark(s.Notified == s.Orders))
		fmt.Fprintf(w, "  sum of notified amounts   %d = sum of distinct orders %d  %s\n", s.NotifiedTotal, s.ExpectedTotal, mark(s.NotifiedTotal == s.ExpectedTotal))
		fmt.Fprintf(w, "  notified twice            %d (%d webhook requests)  %s\n", s.NotifiedTwice, s.NotifyCalls, mark(s.NotifiedTwice == 0))
	}
	if err := s.Check(); err != nil {
		fmt.Fprintf(w, "\nPROOF FAILED: %v\n", err)
		return
	}
	if s.Chain {
		fmt.Fprintf(w, "\nPROOF HOLDS: %d deliveries, %d kills, every order charged exactly once and notified exactly once, none twice.\n", s.Deliveries, s.Kills)
		return
	}
	fmt.Fprintf(w, "\nPROOF HOLDS: %d deliveries, %d kills, every order charged exactly once, none twice.\n", s.Deliveries, s.Kills)
}
