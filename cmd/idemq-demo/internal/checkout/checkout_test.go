package checkout_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"slices"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/cmd/idemq-demo/internal/checkout"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/kafkasource"
)

const accounts = 20

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func suffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func sqliteStore(t *testing.T) checkout.Store {
	t.Helper()
	s, err := checkout.OpenSQLite(testCtx(t), filepath.Join(t.TempDir(), "checkout.db"), accounts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func postgresStore(t *testing.T) checkout.Store {
	t.Helper()
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	s, err := checkout.OpenPostgres(testCtx(t), url, schema, accounts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // before the schema is dropped
	return s
}

// exercise publishes n orders (every tenth twice, one malformed, one for an
// unknown account), runs the worker twice (the first run is stopped early,
// as a deploy would), and checks the ledger: every valid order charged
// exactly once.
func exercise(t *testing.T, cfg checkout.BrokerConfig, store checkout.Store, n int) {
	t.Helper()
	ctx := testCtx(t)
	b, err := checkout.OpenBroker(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if cfg.Kind == checkout.BrokerRabbitMQ { // the first source declares the queue
		rc := checkout.WorkerConfig{}.RunnerConfig()
		src, err := b.Source(ctx, &rc)
		if err != nil {
			t.Fatal(err)
		}
		src.Close()
	}
	run := "order-" + suffix()
	var msgs []checkout.Outgoing
	var want int64
	for i := range n {
		o := checkout.SampleOrder(run, i, accounts)
		want += o.Amount
		msgs = append(msgs, o.Message())
		if i%10 == 0 {
			msgs = append(msgs, o.Message())
		}
	}
	msgs = append(msgs,
		checkout.Outgoing{Key: run + "-bad", Body: []byte("{not json"), PartitionKey: "x"},
		checkout.Order{ID: run + "-nobody", Account: "acct-none", Amount: 5}.Message())
	if err := b.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	// A first worker stops after about a third of the orders.
	first, stop := context.WithCancel(ctx)
	st1, err := checkout.Run(first, checkout.WorkerConfig{Broker: b, Store: store, BatchSize: 10,
		ReportInterval: 10 * time.Millisecond,
		Report: func(st consumer.Stats) {
			if st.Handled >= uint64(n/3) {
				stop()
			}
		}})
	stop()
	if err != nil {
		t.Fatal(err)
	}
	// The second runs until every order was charged and both bad ones
	// dead-lettered, and then one more second for stray redeliveries. It
	// does not stop at the first idle moment: messages that SQS hid for a
	// receive the first worker cancelled when it stopped (or whose response
	// was lost) come back only after their visibility timeout.
	second, stop2 := context.WithCancel(ctx)
	defer stop2()
	var settledAt time.Time
	st2, err := checkout.Run(second, checkout.WorkerConfig{Broker: b, Store: store, BatchSize: 10,
		ReportInterval: 10 * time.Millisecond,
		Report: func(st consumer.Stats) {
			switch {
			case st1.Handled+st.Handled < uint64(n) || st1.DeadLettered+st.DeadLettered < 2:
				settledAt = time.Time{}
			case settledAt.IsZero():
				settledAt = time.Now()
			case time.Since(settledAt) >= time.Second:
				stop2()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := store.Ledger(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first run %+v, second run %+v, ledger %+v", st1, st2, l)
	if l.Orders != int64(n) || l.Rows != int64(n) || l.Total != want || l.DoubleCharged != 0 || l.Debited != want {
		t.Fatalf("ledger %+v; want %d orders in %d rows, total and debit %d, none charged twice", l, n, n, want)
	}
	dead := st1.DeadLettered + st2.DeadLettered
	if cfg.Memory != nil {
		// A duplicate delivery of a bad order is dead-lettered too, which
		// the in-memory broker takes as a no-op once the first copy is in
		// its list (the Runner counts it all the same): the list is the
		// count.
		var keys []string
		for _, d := range cfg.Memory.DeadLetters(cfg.WithDefaults().Topic) {
			keys = append(keys, d.Key)
		}
		slices.Sort(keys)
		if want := []string{run + "-bad", run + "-nobody"}; !slices.Equal(keys, want) || dead < 2 {
			t.Fatalf("dead letters %v (%d counted), want %v (the malformed order and the unknown account)", keys, dead, want)
		}
		return
	}
	if dead != 2 {
		t.Fatalf("%d dead-lettered, want 2 (the malformed order and the unknown account)", dead)
	}
}

func TestMemoryBrokerWithFaultsOnSQLite(t *testing.T) {
	mem := memsource.New(memsource.Config{VisibilityTimeout: 300 * time.Millisecond, Seed: 3})
	mem.Inject(memsource.Fault{Kind: memsource.Redelivered, Probability: 0.1, Times: -1})
	mem.Inject(memsource.Fault{Kind: memsource.CrashAfterCommit, Probability: 0.05, Times: -1})
	exercise(t, checkout.BrokerConfig{Kind: checkout.BrokerMemory, Memory: mem}, sqliteStore(t), 600)
	if st := mem.Stats("checkout-orders"); st.Pending != 0 || st.DroppedAcks == 0 {
		t.Fatalf("broker %+v: want nothing pending and some dropped acks", st)
	}
}

func TestKafkaOnPostgres(t *testing.T) {
	brokers, topic := testenv.KafkaBrokers(t), "checkout-test-"+suffix()
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, kafkasource.DeadLetterTopic(topic))
	exercise(t, checkout.BrokerConfig{Kind: checkout.BrokerKafka, KafkaBrokers: brokers,
		Topic: topic, Group: "checkout-test-" + suffix()}, postgresStore(t), 300)
}

func TestRabbitMQOnSQLite(t *testing.T) {
	url, q := testenv.AMQPURL(t), "checkout-test-"+suffix()
	// The quorum queues the worker's source declares.
	brokerenv.DeleteQueuesAtCleanup(t, url, amqpsource.QueueNames(amqpsource.Config{Queue: q})...)
	exercise(t, checkout.BrokerConfig{Kind: checkout.BrokerRabbitMQ, AMQPURL: url, Topic: q}, sqliteStore(t), 300)
}

func TestSQSOnSQLite(t *testing.T) {
	endpoint, q := testenv.SQSEndpoint(t), "checkout-test-"+suffix()
	brokerenv.DeleteSQSQueuesAtCleanup(t, endpoint, q, q+"-dlq")
	exercise(t, checkout.BrokerConfig{Kind: checkout.BrokerSQS, SQSEndpoint: endpoint, Topic: q}, sqliteStore(t), 300)
}

func TestUnknownBroker(t *testing.T) {
	if _, err := checkout.OpenBroker(testCtx(t), checkout.BrokerConfig{Kind: "carrier-pigeon"}); err == nil {
		t.Fatal("OpenBroker accepted an unknown kind")
	}
}
