package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/amqpsource"
)

// Every notification reaches the webhook once, although a tenth of them were
// published twice and every seventh one fails its first attempt with 503.
func TestWorkerNotifiesEachOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ and Redis; skipped with -short")
	}
	amqpURL, redisURL := testenv.AMQPURL(t), testenv.RedisURL(t)
	const n = 140
	o := options{
		amqpURL: amqpURL, redisURL: redisURL,
		publish: n, idle: time.Second, concurrency: 4, lease: 10 * time.Second,
		log: slog.New(slog.DiscardHandler),
	}
	// The amqpsource tests restart the broker; when they run at the same
	// time as this package, start over on a fresh queue.
	runID := redisRunID(t, redisURL)
	var out bytes.Buffer
	for attempt := 1; ; attempt++ {
		id := randomID()
		o.queue, o.name = "idemq.example.notify.test."+id, "notify-test-"+id
		brokerenv.DeleteQueuesAtCleanup(t, amqpURL, amqpsource.QueueNames(amqpsource.Config{Queue: o.queue})...)
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

	var handled, duplicates, retried, dead, requests, sent, absorbed int
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("output:\n%s", out.String())
	}
	if _, err := fmt.Sscanf(lines[1], "handled %d, duplicates %d, retried %d, dead-lettered %d", &handled, &duplicates, &retried, &dead); err != nil {
		t.Fatalf("runner line %q: %v", lines[1], err)
	}
	if _, err := fmt.Sscanf(lines[2], "receiver: %d requests, %d notifications sent, %d repeated keys absorbed", &requests, &sent, &absorbed); err != nil {
		t.Fatalf("receiver line %q: %v", lines[2], err)
	}
	// Other packages' tests restart Redis; a restart without persistence
	// forgets done keys, and their redeliveries run again (the receiver
	// absorbs them by Idempotency-Key). Only then may handled exceed n.
	restarted := redisRunID(t, redisURL) != runID
	const failedFirst = (n + 6) / 7 // orders 0, 7, 14, ...
	switch {
	case sent != n || dead != 0 || handled < n || (handled != n && !restarted):
		t.Fatalf("handled %d, sent %d, dead-lettered %d; want %d, %d, 0\n%s", handled, sent, dead, n, n, out.String())
	case duplicates < n/10:
		t.Fatalf("%d duplicates acknowledged, want at least the %d published twice", duplicates, n/10)
	case retried < failedFirst || requests < n+failedFirst:
		t.Fatalf("%d retries and %d requests, want at least %d and %d (every seventh first attempt fails)", retried, requests, failedFirst, n+failedFirst)
	}
	t.Logf("\n%s", out.String())
}

// redisRunID returns the run id of the Redis server, which changes when it
// restarts.
func redisRunID(t *testing.T, url string) string {
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	info, err := rdb.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatalf("Redis INFO: %v", err)
	}
	for line := range strings.Lines(info) {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return id
		}
	}
	t.Fatal("Redis INFO has no run_id")
	return ""
}
