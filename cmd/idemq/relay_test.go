package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
)

func TestMigrateOutboxPrint(t *testing.T) {
	code, out, errOut := idemq(t, "migrate", "--outbox", "--dsn", "postgres://nowhere.invalid/db", "--print")
	if code != exitOK || !strings.Contains(out, "CREATE TABLE IF NOT EXISTS idemq_outbox") || !strings.Contains(out, "pg_notify") {
		t.Fatalf("migrate --outbox --print (postgres) = %d:\n%s%s", code, out, errOut)
	}
	code, out, errOut = idemq(t, "migrate", "--outbox", "--dsn", "sqlite:never-created.db", "--print")
	if code != exitOK || !strings.Contains(out, "CREATE TABLE IF NOT EXISTS idemq_outbox") || !strings.Contains(out, "AUTOINCREMENT") {
		t.Fatalf("migrate --outbox --print (sqlite) = %d:\n%s%s", code, out, errOut)
	}
	if code, _, errOut := idemq(t, "relay", "--dsn", "x.db", "--broker", "pulsar"); code != exitUsage {
		t.Fatalf("relay --broker pulsar = %d, want %d:\n%s", code, exitUsage, errOut)
	}
}

// idemq relay publishes the rows of a SQLite outbox to RabbitMQ and
// --stats shows them sent.
func TestRelayCommandSQLiteRabbitMQ(t *testing.T) {
	url := testenv.AMQPURL(t)
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "shop.db")
	if code, out, errOut := idemq(t, "migrate", "--outbox", "--dsn", dsn); code != exitOK || !strings.Contains(out, "up to date") {
		t.Fatalf("migrate --outbox = %d:\n%s%s", code, out, errOut)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	queue := "outbox-cli-" + hex.EncodeToString(b)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	db, err := sqldedup.OpenSQLite(ctx, strings.TrimPrefix(dsn, "sqlite:"))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"order-1/0", "order-2/0", "order-3/0"} {
		// The default exchange routes by queue name: the key is the queue.
		if _, err := outbox.PublishSQL(ctx, tx, outbox.Message{ID: id, Destination: "", Key: queue, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	db.Close()

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	var errOut bytes.Buffer
	go func() {
		done <- runRelay(rctx, []string{"--dsn", dsn, "--broker", "rabbitmq", "--amqp-url", url, "--poll", "50ms"}, &bytes.Buffer{}, &errOut)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		q, err := ch.QueueDeclarePassive(queue, false, true, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d messages, want 3; relay log:\n%s", q.Messages, errOut.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("relay: %v", err)
	}
	code, out, stderr := idemq(t, "relay", "--dsn", dsn, "--stats")
	if code != exitOK || !strings.Contains(out, "pending         0") || !strings.Contains(out, "sent            3") {
		t.Fatalf("relay --stats = %d:\n%s%s", code, out, stderr)
	}
}
