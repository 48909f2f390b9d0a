package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/kafkasource"
)

// The worker credits every distinct payment once, although a tenth of them
// were published twice, and dead-letters the payment to an unknown account.
func TestWorkerCreditsEachPaymentOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka and PostgreSQL; skipped with -short")
	}
	dbURL := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, dbURL)
	topic := "idemq.example.test." + schema
	brokerenv.DeleteTopicsAtCleanup(t, testenv.KafkaBrokers(t), topic, kafkasource.DeadLetterTopic(topic))
	o := options{
		brokers: testenv.KafkaBrokers(t), databaseURL: dbURL,
		topic: topic, group: "idemq-example-test-" + schema, schema: schema,
		partitions: 4, accounts: 10, publish: 200, idle: 2 * time.Second, concurrency: 2, batch: 20,
		log: slog.New(slog.DiscardHandler),
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, o, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	var want int64
	for n := range o.publish {
		want += int64(100 + n%7)
	}
	for _, line := range []string{
		"published 200 payments (20 of them twice) and 1 to an unknown account",
		"handled 200, duplicates 20, retried 0, dead-lettered 1,",
		fmt.Sprintf("credited in total: %d cents", want),
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("output lacks %q:\n%s", line, out.String())
		}
	}
}
