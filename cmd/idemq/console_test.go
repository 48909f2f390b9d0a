package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/console"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/kafkasource/kafkadlq"
	"github.com/idemq/idemq/sources/sqssource"
)

// consoleRig is one broker's part of TestConsoleBrokers.
type consoleRig struct {
	// publish sends a message with the key key to the origin.
	publish func(t *testing.T, key string)
	// source opens a source of the origin that dead-letters.
	source func(t *testing.T) consumer.Source
	// flags are idemq console's flags for the dead-letter store.
	flags []string
	// queue is the dead-letter store's name in the console's URLs.
	queue string
}

// The poison messages of TestConsoleBrokers and their handler's reason.
var consolePoison = map[string]string{"order-2": "bad SKU 17", "order-3": "bad SKU 4", "order-5": "card declined"}

const consoleMessages = 6

// Dead letters made by a real runner on each broker, listed and grouped by
// the console that `idemq console` wires from its flags; one group replayed
// through the console (confirmation, then the replay's progress) and taken
// into effect once in PostgreSQL, the other group left in the dead-letter
// store; the dedup page reads the runner's table.
func TestConsoleBrokers(t *testing.T) {
	t.Run("rabbitmq", func(t *testing.T) {
		url := testenv.AMQPURL(t)
		queue := runtest.UniqueName(t, "idemq-console")
		cfg := amqpsource.Config{URL: url, Queue: queue, Declare: &amqpsource.Topology{}, Logger: runtest.Logger(t)}
		dead := amqpsource.DeadLetterQueue(cfg)
		brokerenv.DeleteQueuesAtCleanup(t, url, queue, dead)
		open := func(t *testing.T) consumer.Source {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			src, err := amqpsource.New(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = src.Close() })
			return src
		}
		first := open(t) // declares the queues
		consoleScenario(t, consoleRig{
			publish: func(t *testing.T, key string) {
				ch := confirmChannel(t, url)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
					Headers: amqp.Table{amqpsource.DefaultKeyHeader: key}, DeliveryMode: amqp.Persistent, MessageId: "id-" + key, Body: []byte(`{"k":"` + key + `"}`)})
				if err != nil {
					t.Fatal(err)
				}
				if ok, err := dc.WaitContext(ctx); err != nil || !ok {
					t.Fatalf("publish not confirmed: %v %v", ok, err)
				}
			},
			source: func(t *testing.T) consumer.Source {
				if first != nil {
					src := first
					first = nil
					return src
				}
				return open(t)
			},
			flags: []string{"--dlq", "rabbitmq:" + dead, "--amqp-url", url},
			queue: dead,
		})
	})

	t.Run("kafka", func(t *testing.T) {
		brokers := testenv.KafkaBrokers(t)
		topic := runtest.UniqueName(t, "idemq-console")
		dead := kafkasource.DeadLetterTopic(topic)
		brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, dead, kafkadlq.ProgressTopic(dead))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic}, kafkasource.TopicSpec{Name: dead}); err != nil {
			t.Fatal(err)
		}
		group := runtest.UniqueName(t, "g")
		consoleScenario(t, consoleRig{
			publish: func(t *testing.T, key string) {
				tr := &kafka.Transport{}
				defer tr.CloseIdleConnections()
				w := &kafka.Writer{Transport: tr, Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
				defer w.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := w.WriteMessages(ctx, kafka.Message{Key: []byte(key), Value: []byte(`{"k":"` + key + `"}`),
					Headers: []kafka.Header{{Key: kafkasource.DefaultKeyHeader, Value: []byte(key)}}}); err != nil {
					t.Fatal(err)
				}
			},
			source: func(t *testing.T) consumer.Source {
				src, err := kafkasource.New(context.Background(), kafkasource.Config{
					Brokers: brokers, Topics: []string{topic}, GroupID: group,
					SessionTimeout: 6 * time.Second, HeartbeatInterval: 300 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
					JoinGroupBackoff: 200 * time.Millisecond, MaxWait: 250 * time.Millisecond, CommitInterval: 100 * time.Millisecond,
					Logger: runtest.Logger(t),
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { src.Close() })
				return src
			},
			flags: []string{"--dlq", "kafka:" + dead, "--brokers", strings.Join(brokers, ",")},
			queue: dead,
		})
	})

	t.Run("sqs", func(t *testing.T) {
		endpoint := testenv.SQSEndpoint(t)
		t.Setenv("AWS_REGION", testenv.SQSRegion)
		t.Setenv("AWS_ACCESS_KEY_ID", testenv.SQSAccessKeyID)
		t.Setenv("AWS_SECRET_ACCESS_KEY", testenv.SQSSecretAccessKey)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := sqssource.NewClient(ctx, endpoint)
		if err != nil {
			t.Fatal(err)
		}
		name := runtest.UniqueName(t, "idemq-console")
		brokerenv.DeleteSQSQueuesAtCleanup(t, endpoint, name, name+"-dlq")
		var urls []string
		for _, n := range []string{name, name + "-dlq"} {
			out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(n)})
			if err != nil {
				t.Fatal(err)
			}
			urls = append(urls, aws.ToString(out.QueueUrl))
		}
		queue, dead := urls[0], urls[1]
		consoleScenario(t, consoleRig{
			publish: func(t *testing.T, key string) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(`{"k":"` + key + `"}`),
					MessageAttributes: map[string]types.MessageAttributeValue{"idempotency-key": {DataType: aws.String("String"), StringValue: aws.String(key)}}}); err != nil {
					t.Fatal(err)
				}
			},
			source: func(t *testing.T) consumer.Source {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				src, err := sqssource.New(ctx, c, sqssource.Config{QueueURL: queue, DeadLetterQueueURL: dead,
					KeyAttribute: "idempotency-key", WaitTime: time.Second, Logger: runtest.Logger(t)})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = src.Close() })
				return src
			},
			flags: []string{"--dlq", "sqs:" + dead, "--sqs-endpoint", endpoint, "--key-attribute", "idempotency-key"},
			queue: name + "-dlq",
		})
	})
}

// consoleScenario is TestConsoleBrokers on one broker.
func consoleScenario(t *testing.T, rg consoleRig) {
	dbURL := testenv.DatabaseURL(t)
	pool, schema := testenv.SchemaPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := idemq(t, "migrate", "--outbox", "--dsn", dbURL, "--schema", schema); code != exitOK {
		t.Fatalf("migrate --outbox: %s", errOut)
	}
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var broken atomic.Bool
	broken.Store(true)
	runner := func(src consumer.Source) *consumer.Runner {
		r, err := consumer.NewRunner(src, consumer.Transactional(store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if reason, ok := consolePoison[m.Key]; ok && broken.Load() {
				return consumer.Permanent(errors.New(reason))
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (key) VALUES ($1)`, m.Key)
			return err
		}), consumer.Config{Name: "orders", Concurrency: 2, Logger: runtest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for i := 1; i <= consoleMessages; i++ {
		rg.publish(t, fmt.Sprintf("order-%d", i))
	}
	src := rg.source(t)
	r := runner(src)
	runtest.RunUntil(t, func() bool {
		st := r.Stats()
		return st.Handled >= consoleMessages-uint64(len(consolePoison)) && st.DeadLettered >= uint64(len(consolePoison))
	}, r)
	_ = src.Close()

	// The console as `idemq console` wires it.
	const token = "console-test-token"
	var f consoleFlags
	fs := newFlags("console", io.Discard)
	f.register(fs)
	if _, err := parse(fs, append([]string{"--dsn", dbURL, "--schema", schema, "--token", token, "--scope", "orders"}, rg.flags...)); err != nil {
		t.Fatal(err)
	}
	f.token = token
	var logs runtest.SyncBuffer
	cfg, closeAll, err := f.config(ctx, &logs)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := httptest.NewServer(c)
	defer srv.Close()
	call := func(method, path string, form url.Values) (int, string) {
		t.Helper()
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Authorization", "Bearer "+token)
		}
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusSeeOther {
			return resp.StatusCode, resp.Header.Get("Location")
		}
		return resp.StatusCode, string(b)
	}
	groupsRE := regexp.MustCompile(`<tr class="group" data-reason="([^"]*)">[\s\S]*?class="num group-count" data-sort="(\d+)"`)
	groups := func() map[string]string {
		_, body := call(http.MethodGet, "/dlq/"+rg.queue, nil)
		out := map[string]string{}
		for _, m := range groupsRE.FindAllStringSubmatch(body, -1) {
			out[m[1]] = m[2]
		}
		if len(out) == 0 && !strings.Contains(body, `id="queue-empty"`) {
			t.Fatalf("the queue page shows no group and does not say it is empty:\n%s", body)
		}
		return out
	}
	var skuGroup string
	got := groups()
	for reason, n := range got {
		switch {
		case strings.Contains(reason, "bad SKU &lt;n&gt;") && n == "2":
			skuGroup = strings.ReplaceAll(strings.ReplaceAll(reason, "&lt;", "<"), "&gt;", ">")
		case strings.Contains(reason, "card declined") && n == "1":
		default:
			t.Errorf("group %q of %s dead letters", reason, n)
		}
	}
	if skuGroup == "" || len(got) != 2 {
		t.Fatalf("groups %v, want the two bad SKUs in one and the declined card in another", got)
	}
	if code, body := call(http.MethodGet, "/", nil); code != http.StatusOK || !regexp.MustCompile(`class="num count"[^>]*>3<`).MatchString(body) {
		t.Errorf("overview (%d) does not count 3 dead letters:\n%s", code, body)
	}
	if _, body := call(http.MethodGet, "/outbox", nil); !strings.Contains(body, `id="outbox-pending">0<`) || !strings.Contains(body, `id="outbox-sent-per-minute">0<`) {
		t.Errorf("the outbox page of an empty outbox:\n%s", body)
	}
	if _, body := call(http.MethodGet, "/dedup", nil); !strings.Contains(body, `<td class="scope-name">orders</td>`) || !strings.Contains(body, fmt.Sprintf(`<td class="num records">%d</td>`, consoleMessages-len(consolePoison))) {
		t.Errorf("the dedup page does not show the runner's %d records:\n%s", consoleMessages-len(consolePoison), body)
	}

	// The handler is fixed; the SKU group is replayed through the console.
	broken.Store(false)
	code, body := call(http.MethodPost, "/dlq/"+rg.queue+"/confirm", url.Values{"action": {"replay"}, "group": {skuGroup}})
	if code != http.StatusOK || !strings.Contains(body, `<span id="confirm-count">2</span>`) {
		t.Fatalf("confirm (%d):\n%s", code, body)
	}
	plan := regexp.MustCompile(`name="plan" value="([0-9a-f]+)"`).FindStringSubmatch(body)[1]
	code, job := call(http.MethodPost, "/dlq/"+rg.queue+"/run", url.Values{"plan": {plan}})
	if code != http.StatusSeeOther {
		t.Fatalf("run: %d %s", code, job)
	}
	var st struct {
		Done    int    `json:"done"`
		Total   int    `json:"total"`
		Running bool   `json:"running"`
		Error   string `json:"error"`
	}
	runtest.WaitFor(t, time.Minute, func() string { return fmt.Sprintf("the replay to end: %+v", st) }, func() bool {
		_, body := call(http.MethodGet, job+"/progress.json", nil)
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("progress.json %q: %v", body, err)
		}
		return !st.Running
	})
	if st.Done != 2 || st.Total != 2 || st.Error != "" {
		t.Fatalf("the replay: %+v, want 2 of 2 without error", st)
	}
	left := groups()
	for reason, n := range left {
		if !strings.Contains(reason, "card declined") || n != "1" {
			t.Errorf("after the replay: group %q of %s dead letters", reason, n)
		}
	}
	if len(left) != 1 {
		t.Errorf("after the replay the groups are %v, want only the declined card's", left)
	}

	// The replayed messages take effect, once each.
	r = runner(rg.source(t))
	runtest.RunUntil(t, func() bool { return r.Stats().Handled >= 2 }, r)
	rows, err := pool.Query(ctx, `SELECT key, count(*) FROM `+effects+` GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	eff := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		eff[k] = n
	}
	for i := 1; i <= consoleMessages; i++ {
		k := fmt.Sprintf("order-%d", i)
		want := 1
		if k == "order-5" {
			want = 0 // left in the dead-letter store
		}
		if eff[k] != want {
			t.Errorf("%s took effect %d times, want %d", k, eff[k], want)
		}
	}
	if strings.Contains(logs.String(), "guest:guest") {
		t.Errorf("the console's log shows a password:\n%s", logs.String())
	}
}

// idemq console refuses a command line it cannot serve safely: mutations
// without a token, malformed --dlq and --worker.
func TestConsoleUsage(t *testing.T) {
	t.Setenv(consoleTokenEnv, "")
	for _, args := range [][]string{
		{"console"},
		{"console", "--read-only", "--dlq", "orders.dlq"},
		{"console", "--read-only", "--dlq", "pulsar:orders.dlq"},
		{"console", "--read-only", "--worker", "http://127.0.0.1:8080/readyz"},
		{"console", "--read-only", "--scope", "orders"},
		{"console", "--read-only", "--prefix", "idemq/"},
		{"console", "--read-only", "extra"},
		{"console", "--token", "short"},
	} {
		if code, _, errOut := idemq(t, args...); code != exitUsage {
			t.Errorf("idemq %s = %d, want %d:\n%s", strings.Join(args, " "), code, exitUsage, errOut)
		}
	}
}

// The whole command on a SQLite store with an outbox, and a RabbitMQ
// dead-letter store that cannot be reached: it listens where --addr says,
// shows the dedup and outbox tables, says the broker is unreachable, and
// no page or log line shows the broker URL's password or the token.
func TestConsoleCommand(t *testing.T) {
	path := t.TempDir() + "/idemq.db"
	for _, args := range [][]string{{"migrate", "--dsn", "sqlite:" + path}, {"migrate", "--outbox", "--dsn", "sqlite:" + path}} {
		if code, _, errOut := idemq(t, args...); code != exitOK {
			t.Fatalf("%v: %s", args, errOut)
		}
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	record(t, db, sqldedup.Config{Dialect: sqldedup.SQLite}, "orders", "o-1", "{}")
	record(t, db, sqldedup.Config{Dialect: sqldedup.SQLite}, "orders", "o-2", "{}")
	now := time.Now()
	for i, r := range outboxRows {
		if _, err := db.Exec(`INSERT INTO idemq_outbox (id, destination, body, state, created_at, sent_at) VALUES (?, 'd', x'00', ?, ?, ?)`,
			"e"+strconv.Itoa(i), r.state, now.Add(-r.age).UnixMilli(), now.Add(-10*time.Second).UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	const token = "cmd-test-token-42"
	t.Setenv(consoleTokenEnv, token)
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut runtest.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runConsole(ctx, []string{"--addr", "127.0.0.1:0", "--dsn", "sqlite:" + path, "--prefix", "/ops",
			"--dlq", "rabbitmq:orders.dlq", "--amqp-url", "amqp://ops:hunter2@127.0.0.1:1/"}, &out, &errOut)
	}()
	addrRE := regexp.MustCompile(`http://(127\.0\.0\.1:\d+)/ops/`)
	runtest.WaitFor(t, 10*time.Second, func() string { return "the console's address in " + out.String() + errOut.String() }, func() bool {
		return addrRE.MatchString(out.String())
	})
	base := "http://" + addrRE.FindStringSubmatch(out.String())[1] + "/ops"
	get := func(p string) string {
		t.Helper()
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", p, resp.StatusCode)
		}
		return string(b)
	}
	var pages strings.Builder
	for p, want := range map[string][]string{
		"/":               {`data-queue="orders.dlq"`, "unreadable"},
		"/dlq/orders.dlq": {`id="queue-error"`},
		"/dedup":          {`<td class="num records">2</td>`, `<td class="num results">2</td>`, `<td class="num failing">0</td>`, `id="dedup-retention">8d<`},
		"/outbox":         {`id="outbox-pending">2<`, `id="outbox-parked" class="bad">1`, `id="outbox-sent-per-minute">1<`},
	} {
		body := get(p)
		pages.WriteString(body)
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("%s lacks %s:\n%s", p, w, body)
			}
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("runConsole: %v", err)
	}
	for _, secret := range []string{"hunter2", token} {
		if strings.Contains(pages.String(), secret) || strings.Contains(out.String()+errOut.String(), secret) {
			t.Errorf("%q shown in a page or the output:\n%s\n%s", secret, out.String(), errOut.String())
		}
	}
	if !strings.Contains(errOut.String(), "console: list dead letters") {
		t.Errorf("the unreachable broker is not logged:\n%s", errOut.String())
	}
}

// The dedup page's partitions come from PostgreSQL's catalog: a range
// partitioned table lists each partition with its bound; a plain table
// none.
func TestConsolePartitions(t *testing.T) {
	dbURL := testenv.DatabaseURL(t)
	pool, schema := testenv.SchemaPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	for _, stmt := range []string{
		`CREATE TABLE ` + q("parted") + ` (scope text, key text, processed_at timestamptz NOT NULL) PARTITION BY RANGE (processed_at)`,
		`CREATE TABLE ` + q("parted_20260101") + ` PARTITION OF ` + q("parted") + ` FOR VALUES FROM ('2026-01-01') TO ('2026-01-02')`,
		`CREATE TABLE ` + q("parted_20260102") + ` PARTITION OF ` + q("parted") + ` FOR VALUES FROM ('2026-01-02') TO ('2026-01-03')`,
		`CREATE TABLE ` + q("plain") + ` (scope text)`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ps, err := partitions(ctx, db, `"`+schema+`"."parted"`)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || !strings.HasSuffix(ps[0].Name, "parted_20260101") || !strings.Contains(ps[0].Bound, "2026-01-01") || !strings.HasSuffix(ps[1].Name, "parted_20260102") {
		t.Errorf("partitions %+v, want the two days in order", ps)
	}
	if ps, err := partitions(ctx, db, `"`+schema+`"."plain"`); err != nil || ps != nil {
		t.Errorf("partitions of a plain table: %+v, %v", ps, err)
	}
}

// The dedup page counts the transactions claiming now: a claim not
// committed yet is invisible to the console's session, its transaction's
// lock on the table is not. One open claim shows 1 and its age; after its
// commit, 0. A console whose role may not see the claiming session's start
// (another role's, without pg_read_all_stats) still counts it and says it
// cannot date it.
func TestConsoleClaiming(t *testing.T) {
	for _, hidden := range []bool{false, true} {
		t.Run(map[bool]string{false: "Visible", true: "OtherRole"}[hidden], func(t *testing.T) { consoleClaiming(t, hidden) })
	}
}

func consoleClaiming(t *testing.T, hidden bool) {
	dbURL := testenv.DatabaseURL(t)
	pool, schema := testenv.SchemaPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if hidden {
		// The console's sessions take a role of their own, which may read
		// the schema's tables and nothing more.
		role := pgx.Identifier{schema + "_console"}.Sanitize()
		for _, stmt := range []string{`CREATE ROLE ` + role + ` NOLOGIN`,
			`GRANT USAGE ON SCHEMA ` + pgx.Identifier{schema}.Sanitize() + ` TO ` + role,
			`GRANT SELECT ON ALL TABLES IN SCHEMA ` + pgx.Identifier{schema}.Sanitize() + ` TO ` + role} {
			if _, err := pool.Exec(ctx, stmt); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			if _, err := pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role); err != nil {
				t.Error(err)
			}
		})
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("options", "--role="+schema+"_console")
		u.RawQuery = q.Encode()
		dbURL = u.String()
	}
	var f consoleFlags
	fs := newFlags("console", io.Discard)
	f.register(fs)
	if _, err := parse(fs, []string{"--dsn", dbURL, "--schema", schema, "--read-only"}); err != nil {
		t.Fatal(err)
	}
	cfg, closeAll, err := f.config(ctx, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := httptest.NewServer(c)
	defer srv.Close()
	page := func() string {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/dedup", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || strings.Contains(string(b), `id="dedup-error"`) {
			t.Fatalf("dedup page: %d\n%s", resp.StatusCode, b)
		}
		return string(b)
	}
	want := func(body string, frags ...string) {
		t.Helper()
		for _, w := range frags {
			if !strings.Contains(body, w) {
				t.Errorf("dedup page lacks %s:\n%s", w, body)
			}
		}
	}
	want(page(), `id="dedup-claiming">0<`, `id="dedup-claiming-age">—<`)

	tx, _, err := store.Driver().BeginClaim(ctx, "orders", []dedup.Record{{Key: "order-1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	body := page()
	want(body, `id="dedup-claiming">1<`)
	if hidden {
		want(body, `id="dedup-claiming-age">unknown<`, `id="claiming-hidden">1 of the transactions`)
	} else {
		if !regexp.MustCompile(`id="dedup-claiming-age">\d+[sm] ago<`).MatchString(body) {
			t.Errorf("dedup page shows no age of the open claim's transaction:\n%s", body)
		}
		if strings.Contains(body, `id="claiming-hidden"`) {
			t.Errorf("a console that may see the claiming session says it may not:\n%s", body)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want(page(), `id="dedup-claiming">0<`)
}
