package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/testenv"
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
	t.Cleanup(func() { deleteTopics(testenv.KafkaBrokers(t), "idemq.example.test."+schema) })
	o := options{
		brokers: testenv.KafkaBrokers(t), databaseURL: dbURL,
		topic: "idemq.example.test." + schema, group: "idemq-example-test-" + schema, schema: schema,
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

// deleteTopics deletes the test's topic and its dead-letter topic, best
// effort.
func deleteTopics(brokers []string, topic string) {
	conn, err := kafka.Dial("tcp", brokers[0])
	if err != nil {
		return
	}
	defer conn.Close()
	c, err := conn.Controller()
	if err != nil {
		return
	}
	cc, err := kafka.Dial("tcp", net.JoinHostPort(c.Host, strconv.Itoa(c.Port)))
	if err != nil {
		return
	}
	defer cc.Close()
	_ = cc.DeleteTopics(topic, kafkasource.DeadLetterTopic(topic))
}
