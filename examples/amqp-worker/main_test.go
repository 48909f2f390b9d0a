package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/testenv"
)

// The worker credits every distinct payment once, although a tenth of them
// were published twice.
func TestWorkerCreditsEachPaymentOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ and PostgreSQL; skipped with -short")
	}
	amqpURL, dbURL := testenv.AMQPURL(t), testenv.DatabaseURL(t)
	schema := testenv.Schema(t, dbURL)
	queue := "idemq.example.test." + schema
	t.Cleanup(func() { deleteQueue(t, amqpURL, queue) })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	o := options{
		amqpURL: amqpURL, databaseURL: dbURL, queue: queue, schema: schema,
		accounts: 10, publish: 200, idle: time.Second, concurrency: 2, batch: 20,
		log: slog.New(slog.DiscardHandler),
	}
	if err := run(ctx, o, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	var want int64
	for n := range o.publish {
		want += int64(100 + n%7)
	}
	for _, line := range []string{
		"handled 200, duplicates 20,",
		fmt.Sprintf("credited in total: %d cents", want),
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("output lacks %q:\n%s", line, out.String())
		}
	}
}

func deleteQueue(t *testing.T, url, queue string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, q := range []string{queue, queue + ".dlq"} {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
}
