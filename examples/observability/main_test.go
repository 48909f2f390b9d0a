package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/kafkasource"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The worker, on the real Kafka and PostgreSQL, serves its probes and its
// metrics in the Prometheus format: the messaging system is kafka, the
// duplicate, retry and dead-letter counters move, the Kafka lag and dedup
// table gauges are there, and its log lines about messages carry their
// trace ids.
func TestServesHealthAndMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka and PostgreSQL; skipped with -short")
	}
	dbURL := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, dbURL)
	topic := "idemq.example.obs." + schema
	brokers := testenv.KafkaBrokers(t)
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, kafkasource.DeadLetterTopic(topic))
	o := options{brokers: brokers, databaseURL: dbURL, topic: topic, group: "idemq-example-obs-" + schema,
		schema: schema, publish: 100, janitor: 200 * time.Millisecond}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var logs runtest.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, ln, &logs) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("run: %v", err)
		}
	}()
	base := "http://" + ln.Addr().String()

	want := []string{
		`messaging_client_consumed_messages_total{`,
		`messaging_system="kafka"`,
		`messaging_consumer_group_name="` + o.group + `"`,
		"messaging_process_duration_seconds_bucket",
		"messaging_client_operation_duration_seconds_bucket",
		`idemq_duplicates_total{`,
		`idemq_dead_letters_total{`,
		`idemq_dead_letter_reason="malformed"`,
		`idemq_retry_kind="handler"`,
		"idemq_batch_size",
		"idemq_kafka_lag",
		"idemq_dedup_records",
	}
	var body string
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		var code int
		code, body = get(t, base+"/metrics")
		missing := false
		for _, w := range want {
			missing = missing || !strings.Contains(body, w)
		}
		if code == http.StatusOK && !missing {
			break
		}
		if err := ctx.Err(); err != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("/metrics has no %s", w)
		}
	}
	if strings.Contains(body, `messaging_system="idemq"`) {
		t.Errorf(`/metrics reports messaging_system="idemq"`)
	}
	if code, h := get(t, base+"/readyz"); code != http.StatusOK || !strings.Contains(h, `"ready":true`) {
		t.Errorf("/readyz: %d %s", code, h)
	}
	if code, _ := get(t, base+"/livez"); code != http.StatusOK {
		t.Errorf("/livez: %d", code)
	}
	if !strings.Contains(logs.String(), "trace_id=") {
		t.Errorf("no log line carries a trace id:\n%s", logs.String())
	}
}
