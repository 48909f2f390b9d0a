package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
)

// lockedBuffer is a bytes.Buffer safe for a writer and a reader at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// idemq relay on RabbitMQ with rows for a queue that does not exist
// (NO_ROUTE): the relay logs the failure with err=; relay --stats (and
// --json, not HTML-escaped) shows the rows failing or parked with the
// broker's error; relay unpark --dry-run lists them and changes nothing;
// relay unpark ID and --all put them back to pending, and refuse an id
// that names no parked row. On SQLite and on PostgreSQL.
func TestRelayStatsAndUnpark(t *testing.T) {
	for _, d := range []string{"sqlite", "postgres"} {
		t.Run(d, func(t *testing.T) {
			amqpURL := testenv.AMQPURL(t)
			ctx := context.Background()
			b := make([]byte, 4)
			_, _ = rand.Read(b)
			suffix := hex.EncodeToString(b)
			missing := "missing<&>-" + suffix // never declared: the default exchange returns NO_ROUTE
			queue := "outbox-unpark-" + suffix
			conn, err := amqp.Dial(amqpURL)
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
			msgs := []outbox.Message{
				{ID: "lost-1", Destination: "", RoutingKey: missing, Key: "k-1", Body: []byte("1")},
				{ID: "lost-2", Destination: "", RoutingKey: missing, Key: "k-2", Body: []byte("2")},
				{ID: "fine-1", Destination: "", RoutingKey: queue, Key: "k-3", Body: []byte("3")},
			}

			var dsn []string // --dsn and, on PostgreSQL, --schema
			switch d {
			case "sqlite":
				file := filepath.Join(t.TempDir(), "shop.db")
				dsn = []string{"--dsn", "sqlite:" + file}
				if code, out, errOut := idemq(t, append([]string{"migrate", "--outbox"}, dsn...)...); code != exitOK {
					t.Fatalf("migrate --outbox = %d:\n%s%s", code, out, errOut)
				}
				db, err := sqldedup.OpenSQLite(ctx, file)
				if err != nil {
					t.Fatal(err)
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range msgs {
					if _, err := outbox.PublishSQL(ctx, tx, m); err != nil {
						t.Fatal(err)
					}
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				db.Close()
			case "postgres":
				url := testenv.DatabaseURL(t)
				schema := testenv.Schema(t, url)
				dsn = []string{"--dsn", url, "--schema", schema}
				if code, out, errOut := idemq(t, append([]string{"migrate", "--outbox"}, dsn...)...); code != exitOK {
					t.Fatalf("migrate --outbox = %d:\n%s%s", code, out, errOut)
				}
				pool, err := pgxpool.New(ctx, url)
				if err != nil {
					t.Fatal(err)
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range msgs {
					if _, err := outbox.Schema(schema).Publish(ctx, tx, m); err != nil {
						t.Fatal(err)
					}
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				pool.Close()
			}
			cmd := func(args ...string) (int, string, string) {
				t.Helper()
				return idemq(t, append(append([]string{"relay"}, args...), dsn...)...)
			}
			type statsOut struct {
				Pending, Failing, Sent, Parked int64
				Failures                       []failureJSON
			}
			stats := func() (statsOut, string) {
				t.Helper()
				code, out, errOut := cmd("--stats", "--json")
				var s statsOut
				if code != exitOK {
					t.Fatalf("relay --stats --json = %d:\n%s%s", code, out, errOut)
				}
				if err := json.Unmarshal([]byte(out), &s); err != nil {
					t.Fatalf("relay --stats --json: %v:\n%s", err, out)
				}
				return s, out
			}

			// The relay: the rows for the missing queue fail twice and are parked.
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			var relayLog lockedBuffer
			go func() {
				done <- runRelay(rctx, append([]string{"--broker", "rabbitmq", "--amqp-url", amqpURL, "--poll", "50ms", "--max-attempts", "2"}, dsn...), &bytes.Buffer{}, &relayLog)
			}()
			deadline := time.Now().Add(30 * time.Second)
			for {
				if s, _ := stats(); s.Parked == 2 && s.Sent == 1 {
					break
				}
				if time.Now().After(deadline) {
					_, out, _ := cmd("--stats")
					t.Fatalf("the relay did not park the 2 rows:\n%s\nrelay log:\n%s", out, relayLog.String())
				}
				time.Sleep(50 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("relay: %v", err)
			}
			log := relayLog.String()
			if !strings.Contains(log, `msg="outbox relay: publish failed; the row will be retried"`) || !strings.Contains(log, "NO_ROUTE") || strings.Contains(log, " error=") {
				t.Fatalf("relay log, want the first failure with its NO_ROUTE under err=:\n%s", log)
			}

			s, raw := stats()
			if s.Pending != 0 || s.Failing != 0 || len(s.Failures) != 1 {
				t.Fatalf("relay --stats --json:\n%s\nwant 2 parked in one group", raw)
			}
			g := s.Failures[0]
			if g.Destination != "" || g.RoutingKey != missing || g.Parked != 2 || g.Failing != 0 || g.LastID != "lost-2" || !strings.Contains(g.Error, "NO_ROUTE") {
				t.Fatalf("failure group %+v, want lost-1 and lost-2 parked with NO_ROUTE", g)
			}
			if !strings.Contains(raw, `"routing_key": "`+missing+`"`) {
				t.Fatalf("relay --stats --json escapes the routing key %q:\n%s", missing, raw)
			}
			code, out, errOut := cmd("--stats")
			for _, want := range []string{"parked          2", "failing       0", "NO_ROUTE", `"" routing key "` + missing + `"`, "lost-2", "idemq relay unpark"} {
				if code != exitOK || !strings.Contains(out, want) {
					t.Fatalf("relay --stats = %d, want %q in:\n%s%s", code, want, out, errOut)
				}
			}

			code, out, errOut = cmd("unpark", "--all", "--dry-run")
			if code != exitOK || !strings.Contains(out, "would unpark 2 rows") || !strings.Contains(out, "lost-1") || !strings.Contains(out, "lost-2") {
				t.Fatalf("unpark --all --dry-run = %d:\n%s%s", code, out, errOut)
			}
			if s, _ := stats(); s.Parked != 2 {
				t.Fatalf("after a dry run: %d parked, want 2", s.Parked)
			}
			if code, out, errOut := cmd("unpark", "lost-1", "nope"); code != exitFailure || !strings.Contains(errOut, "no parked row with id nope") {
				t.Fatalf("unpark lost-1 nope = %d, want %d and nope named:\n%s%s", code, exitFailure, out, errOut)
			}
			if s, _ := stats(); s.Parked != 2 {
				t.Fatalf("after a refused unpark: %d parked, want 2", s.Parked)
			}
			if code, out, errOut := cmd("unpark", "lost-1"); code != exitOK || !strings.Contains(out, "unparked 1 row:") {
				t.Fatalf("unpark lost-1 = %d:\n%s%s", code, out, errOut)
			}
			if s, _ := stats(); s.Parked != 1 || s.Pending != 1 {
				t.Fatalf("after unpark lost-1: %+v, want 1 parked and 1 pending", s)
			}
			code, out, errOut = cmd("unpark", "--all", "--json")
			var u unparkJSON
			if code != exitOK || json.Unmarshal([]byte(out), &u) != nil || u.Unparked != 1 || u.DryRun || len(u.Rows) != 1 || u.Rows[0].ID != "lost-2" || u.Rows[0].RoutingKey != missing {
				t.Fatalf("unpark --all --json = %d:\n%s%s", code, out, errOut)
			}
			if s, _ := stats(); s.Parked != 0 || s.Pending != 2 {
				t.Fatalf("after unpark --all: %+v, want 2 pending", s)
			}
			for _, args := range [][]string{{"unpark"}, {"unpark", "--all", "lost-1"}, {"--dry-run"}, {"--all"}, {"--json"}, {"--stats", "unpark", "--all"}, {"unpark-all"}} {
				if code, _, errOut := cmd(args...); code != exitUsage {
					t.Fatalf("relay %q = %d, want %d:\n%s", args, code, exitUsage, errOut)
				}
			}
		})
	}
}
