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
	"github.com/idemq/idemq/sources/amqpsource"
)

// The worker credits every distinct payment once, although a tenth of them
// were published twice.
func TestWorkerCreditsEachPaymentOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ and PostgreSQL; skipped with -short")
	}
	amqpURL, dbURL := testenv.AMQPURL(t), testenv.DatabaseURL(t)
	o := options{
		amqpURL: amqpURL, databaseURL: dbURL,
		accounts: 10, publish: 200, idle: time.Second, concurrency: 2, batch: 20,
		log: slog.New(slog.DiscardHandler),
	}
	// The amqpsource tests restart the broker; when they run at the same
	// time as this package, start over on a fresh queue and schema.
	var out bytes.Buffer
	for attempt := 1; ; attempt++ {
		o.schema = testenv.Schema(t, dbURL)
		queue := "idemq.example.test." + o.schema
		o.queue = queue
		brokerenv.DeleteQueuesAtCleanup(t, amqpURL, amqpsource.QueueNames(amqpsource.Config{Queue: queue})...)
		out.Reset()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := run(ctx, o, &out)
		cancel()
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
		t.Logf("run failed (broker restarting?), starting over: %v", err)
		time.Sleep(5 * time.Second)
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
