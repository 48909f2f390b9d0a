package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/kafkasource/kafkadlq"
	"github.com/idemq/idemq/sources/sqssource"
)

// The command line refuses what would surprise an operator: no
// subcommand, a purge of everything without --all, a malformed glob or
// time; and it never prints a URL's password.
func TestDLQUsage(t *testing.T) {
	for _, args := range [][]string{
		{"dlq", "--broker", "kafka", "--dlq", "t.dlq"},
		{"dlq", "drop", "--broker", "kafka", "--dlq", "t.dlq"},
		{"dlq", "purge", "--broker", "kafka", "--dlq", "t.dlq"},
		{"dlq", "list", "--broker", "kafka", "--dlq", "t.dlq", "--key", "[a-"},
		{"dlq", "list", "--broker", "kafka", "--dlq", "t.dlq", "--since", "yesterday"},
		{"dlq", "list", "--broker", "kafka", "--dlq", "t.dlq", "--dry-run"},
		{"dlq", "list", "--broker", "pulsar", "--dlq", "t.dlq"},
		{"dlq", "list", "--broker", "kafka"},
		{"dlq", "show", "--broker", "kafka", "--dlq", "t.dlq"},
	} {
		if code, _, errOut := idemq(t, args...); code != exitUsage {
			t.Errorf("idemq %s = %d, want %d:\n%s", strings.Join(args, " "), code, exitUsage, errOut)
		}
	}
	code, out, errOut := idemq(t, "dlq", "list", "--broker", "rabbitmq", "--dlq", "q.dlq", "--amqp-url", "amqp://ops:hunter2@127.0.0.1:1/")
	if code != exitFailure || strings.Contains(out+errOut, "hunter2") {
		t.Errorf("dlq list on an unreachable broker = %d, want %d and no password:\n%s%s", code, exitFailure, out, errOut)
	}
}

// idemq dlq on ElasticMQ: list --json, show, purge --dry-run, a purge by
// reason, a replay of a selection (receive, send, delete: idemq's metadata
// dropped) and a replay of the rest (SQS's message-move task where the
// endpoint has one, as this ElasticMQ does).
func TestDLQCommandSQS(t *testing.T) {
	endpoint := testenv.SQSEndpoint(t)
	t.Setenv("AWS_REGION", testenv.SQSRegion)
	t.Setenv("AWS_ACCESS_KEY_ID", testenv.SQSAccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", testenv.SQSSecretAccessKey)
	c := sqs.New(sqs.Options{Region: testenv.SQSRegion, BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider(testenv.SQSAccessKeyID, testenv.SQSSecretAccessKey, "")})
	name := runtest.UniqueName(t, "idemq-cli")
	brokerenv.DeleteSQSQueuesAtCleanup(t, endpoint, name, name+"-dlq")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var urls []string
	for _, n := range []string{name, name + "-dlq"} {
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(n)})
		if err != nil {
			t.Fatal(err)
		}
		urls = append(urls, aws.ToString(out.QueueUrl))
	}
	origin, dead := urls[0], urls[1]
	str := func(s string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
	}
	for _, m := range []struct{ key, reason string }{{"o-1", "bad SKU"}, {"o-2", "bad SKU"}, {"o-3", "card declined"}} {
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dead), MessageBody: aws.String(`{"k":"` + m.key + `"}`),
			MessageAttributes: map[string]types.MessageAttributeValue{
				consumer.MetaReason: str(m.reason), sqssource.MetaOriginQueue: str(origin), sqssource.MetaOriginMessageID: str("m-" + m.key),
				consumer.MetaAttempts: {DataType: aws.String("Number"), StringValue: aws.String("5")}, "key": str(m.key),
			}}); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"--broker", "sqs", "--dlq", dead, "--sqs-endpoint", endpoint, "--key-attribute", "key"}
	dlqCmd := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := idemq(t, append(append([]string{"dlq"}, args...), base...)...)
		if code != want {
			t.Fatalf("idemq dlq %s = %d, want %d:\n%s%s", strings.Join(args, " "), code, want, out, errOut)
		}
		return out
	}

	var listed []letterJSON
	if err := json.Unmarshal([]byte(dlqCmd(exitOK, "list", "--json")), &listed); err != nil || len(listed) != 3 {
		t.Fatalf("list --json: %d letters, %v", len(listed), err)
	}
	if out := dlqCmd(exitOK, "show", "o-3"); !strings.Contains(out, "reason:           card declined") || !strings.Contains(out, `{"k":"o-3"}`) {
		t.Errorf("show o-3:\n%s", out)
	}
	if out := dlqCmd(exitOK, "purge", "--dry-run", "--all"); !strings.Contains(out, "dry run, nothing changed") {
		t.Errorf("purge --dry-run:\n%s", out)
	}
	if out := dlqCmd(exitOK, "list"); !strings.Contains(out, "3 dead letters") {
		t.Fatalf("after purge --dry-run:\n%s", out)
	}
	if out := dlqCmd(exitOK, "purge", "--reason", "declined"); !strings.Contains(out, "purged 1 dead letter") {
		t.Fatalf("purge --reason declined:\n%s", out)
	}
	if out := dlqCmd(exitOK, "replay", "--key", "o-1"); !strings.Contains(out, "replayed 1 dead letter") {
		t.Fatalf("replay --key o-1:\n%s", out)
	}
	native := dlqCmd(exitOK, "replay")
	if !strings.Contains(native, "replayed 1 dead letter") {
		t.Fatalf("replay:\n%s", native)
	}
	t.Logf("idemq dlq replay: %s", native)
	if out := dlqCmd(exitOK, "list"); !strings.Contains(out, "0 dead letters") {
		t.Fatalf("after the replay:\n%s", out)
	}
	got := map[string]bool{}
	for len(got) < 2 {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(origin), MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			t.Fatalf("the origin holds %v, want o-1 and o-2", got)
		}
		for _, m := range out.Messages {
			key := aws.ToString(m.MessageAttributes["key"].StringValue)
			if _, ok := m.MessageAttributes[consumer.MetaReason]; ok && (key == "o-1" || !strings.Contains(native, "message-move task")) {
				t.Errorf("replayed %s kept idemq's dead-letter metadata: %v", aws.ToString(m.Body), m.MessageAttributes)
			}
			got[key] = true
		}
	}
	if !got["o-1"] || !got["o-2"] || got["o-3"] {
		t.Errorf("the origin holds %v, want o-1 and o-2", got)
	}
}

// idemq dlq on Kafka: a replay of a selection, then of the rest; the
// progress group remembers both, and the origin gets each copy once,
// without idemq's metadata.
func TestDLQCommandKafka(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := runtest.UniqueName(t, "idemq-cli")
	dead := kafkasource.DeadLetterTopic(topic)
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, dead, kafkadlq.ProgressTopic(dead))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic}, kafkasource.TopicSpec{Name: dead}); err != nil {
		t.Fatal(err)
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Transport: tr, Addr: kafka.TCP(brokers...), Topic: dead, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	var msgs []kafka.Message
	for i, k := range []string{"k-1", "k-2", "x-3"} {
		msgs = append(msgs, kafka.Message{Key: []byte(k), Value: []byte(`{"k":"` + k + `"}`), Headers: []kafka.Header{
			{Key: "idempotency-key", Value: []byte(k)},
			{Key: consumer.MetaReason, Value: []byte("boom " + k)},
			{Key: consumer.MetaAttempts, Value: []byte("5")},
			{Key: kafkasource.MetaOriginTopic, Value: []byte(topic)},
			{Key: kafkasource.MetaOriginPartition, Value: []byte("0")},
			{Key: kafkasource.MetaOriginOffset, Value: []byte(strconv.Itoa(i))},
			{Key: consumer.MetaKey, Value: []byte(k)},
			{Key: consumer.MetaDeadLetteredAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		}})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	group := runtest.UniqueName(t, "g")
	dlqCmd := func(args ...string) string {
		t.Helper()
		args = append(append([]string{"dlq"}, args...), "--broker", "kafka", "--brokers", strings.Join(brokers, ","), "--dlq", dead, "--group", group)
		code, out, errOut := idemq(t, args...)
		if code != exitOK {
			t.Fatalf("idemq %s = %d:\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	if out := dlqCmd("replay", "--key", "*-2"); !strings.Contains(out, "replayed 1 dead letter") {
		t.Fatalf("replay --key *-2:\n%s", out)
	}
	if out := dlqCmd("list"); !strings.Contains(out, "2 dead letters") || strings.Contains(out, "k-2") {
		t.Fatalf("list after replaying k-2:\n%s", out)
	}
	if out := dlqCmd("replay"); !strings.Contains(out, "replayed 2 dead letters") {
		t.Fatalf("replay:\n%s", out)
	}
	if out := dlqCmd("list"); !strings.Contains(out, "0 dead letters") {
		t.Fatalf("list after the replay:\n%s", out)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	got := map[string]int{}
	for i := 0; i < 3; i++ {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read the origin after %v: %v", got, err)
		}
		for _, h := range m.Headers {
			if strings.HasPrefix(h.Key, "idemq-") {
				t.Errorf("replayed %s kept header %s", m.Key, h.Key)
			}
		}
		got[string(m.Key)]++
	}
	if got["k-1"] != 1 || got["k-2"] != 1 || got["x-3"] != 1 {
		t.Errorf("the origin holds %v, want each key once", got)
	}
	if last := brokerenv.LastOffset(t, brokers, topic, 0); last != 3 {
		t.Errorf("the origin holds %d messages, want 3", last)
	}
}

// idemq dlq on RabbitMQ: show by key, purge --dry-run, a replay of a
// selection, then a purge of the rest by reason.
func TestDLQCommandRabbitMQ(t *testing.T) {
	r := newRabbitDLQ(t, "idemq-cli")
	queue := r.queue
	for _, m := range []struct{ key, reason string }{{"r-1", "bad SKU"}, {"r-2", "card declined"}, {"r-3", "bad SKU"}} {
		r.deadLetter(t, `{"k":"`+m.key+`"}`, amqp.Table{"idempotency-key": m.key, "tenant": "acme", consumer.MetaReason: m.reason,
			consumer.MetaAttempts: int64(5), amqpsource.MetaOriginQueue: queue, consumer.MetaKey: m.key,
			consumer.MetaDeadLetteredAt: time.Now().UTC().Format(time.RFC3339Nano)})
	}
	dlqCmd := func(args ...string) string {
		t.Helper()
		return r.cmd(t, args...)
	}
	if out := dlqCmd("show", "r-2"); !strings.Contains(out, "card declined") || !strings.Contains(out, "header:           tenant=acme") || !strings.Contains(out, "origin:           "+queue) {
		t.Errorf("show r-2:\n%s", out)
	}
	if out := dlqCmd("purge", "--dry-run", "--reason", "sku"); !strings.Contains(out, "dry run, nothing changed") || !strings.Contains(out, "2 dead letters") {
		t.Errorf("purge --dry-run --reason sku:\n%s", out)
	}
	if out := dlqCmd("replay", "--reason", "declined"); !strings.Contains(out, "replayed 1 dead letter") {
		t.Fatalf("replay --reason declined:\n%s", out)
	}
	if out := dlqCmd("purge", "--reason", "SKU"); !strings.Contains(out, "purged 2 dead letters") {
		t.Fatalf("purge --reason SKU:\n%s", out)
	}
	if out := dlqCmd("list"); !strings.Contains(out, "0 dead letters") {
		t.Fatalf("list:\n%s", out)
	}
	d, ok, err := r.ch.Get(queue, true)
	if err != nil || !ok {
		t.Fatalf("the origin queue holds no replayed copy: %v", err)
	}
	if d.Headers["idempotency-key"] != "r-2" || d.Headers["tenant"] != "acme" || d.Headers[consumer.MetaReason] != nil {
		t.Errorf("replayed copy's headers %v: want the key and tenant, no idemq metadata", d.Headers)
	}
	if _, more, _ := r.ch.Get(queue, true); more {
		t.Errorf("the origin queue holds more than the one replayed copy")
	}
}

// idemq dlq list never cuts the selection silently: the table says when
// more dead letters are left than it shows (100 unless --limit), --limit 0
// shows them all, and --json prints the whole selection unless --limit
// says otherwise. Counts of one are singular.
func TestDLQListLimit(t *testing.T) {
	const n = 103
	brokers := testenv.KafkaBrokers(t)
	topic := runtest.UniqueName(t, "idemq-cli-limit")
	dead := kafkasource.DeadLetterTopic(topic)
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, dead, kafkadlq.ProgressTopic(dead))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic}, kafkasource.TopicSpec{Name: dead}); err != nil {
		t.Fatal(err)
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Transport: tr, Addr: kafka.TCP(brokers...), Topic: dead, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	var msgs []kafka.Message
	for i := range n {
		k := fmt.Sprintf("k-%03d", i)
		msgs = append(msgs, kafka.Message{Value: []byte(k), Headers: []kafka.Header{
			{Key: consumer.MetaKey, Value: []byte(k)}, {Key: consumer.MetaReason, Value: []byte("boom")},
			{Key: kafkasource.MetaOriginTopic, Value: []byte(topic)},
		}})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	group := runtest.UniqueName(t, "g")
	dlqCmd := func(args ...string) (string, string) {
		t.Helper()
		args = append(append([]string{"dlq"}, args...), "--broker", "kafka", "--brokers", strings.Join(brokers, ","), "--dlq", dead, "--group", group)
		code, out, errOut := idemq(t, args...)
		if code != exitOK {
			t.Fatalf("idemq %s = %d:\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out, errOut
	}
	count := func(out string) int { return strings.Count(out, " boom\n") }
	out, _ := dlqCmd("list")
	if count(out) != 100 || !strings.HasSuffix(out, "\nthe first 100 dead letters shown; more are left (--limit 0 shows all)\n") {
		t.Errorf("list: %d rows; want 100 and a line that says more are left, on stdout:\n%s", count(out), out[max(0, len(out)-300):])
	}
	out, _ = dlqCmd("list", "--limit", "0")
	if count(out) != n || !strings.HasSuffix(out, "\n103 dead letters\n") {
		t.Errorf("list --limit 0: %d rows, want %d:\n%s", count(out), n, out[max(0, len(out)-300):])
	}
	out, _ = dlqCmd("list", "--limit", "2")
	if count(out) != 2 || !strings.HasSuffix(out, "\nthe first 2 dead letters shown; more are left (--limit 0 shows all)\n") {
		t.Errorf("list --limit 2:\n%s", out)
	}
	var listed []letterJSON
	out, _ = dlqCmd("list", "--json")
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != n {
		t.Errorf("list --json: %d letters, %v; want %d", len(listed), err, n)
	}
	out, errOut := dlqCmd("list", "--json", "--limit", "3")
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 3 || !strings.Contains(errOut, "the first 3 dead letters shown; more are left") {
		t.Errorf("list --json --limit 3: %d letters, %v; stderr %q", len(listed), err, errOut)
	}
	out, _ = dlqCmd("list", "--key", "k-007")
	if !strings.HasSuffix(out, "\n1 dead letter\n") {
		t.Errorf("list --key k-007:\n%s", out)
	}
	out, _ = dlqCmd("replay", "--key", "k-00[12]", "--dry-run")
	if !strings.HasPrefix(out, "dry run, nothing changed: 2 dead letters would be replayed\n") {
		t.Errorf("replay --dry-run:\n%s", out)
	}
	out, _ = dlqCmd("purge", "--key", "k-001")
	if out != "purged 1 dead letter\n" {
		t.Errorf("purge --key k-001: %q", out)
	}
}

// The IDs that idemq dlq shows stay the same after a replay or purge of
// other dead letters, and replay, purge and show take them (or keys) as
// arguments, here on RabbitMQ dead letters without a MessageId. purge
// takes --dry-run and --json.
func TestDLQStableIDs(t *testing.T) {
	r := newRabbitDLQ(t, "idemq-cli-ids")
	for _, k := range []string{"s-1", "s-2", "s-3", "s-4"} {
		r.deadLetter(t, `{"k":"`+k+`"}`, amqp.Table{consumer.MetaReason: "boom", amqpsource.MetaOriginQueue: r.queue, consumer.MetaKey: k})
	}
	dlqCmd := func(args ...string) string {
		t.Helper()
		return r.cmd(t, args...)
	}
	ids := func() map[string]string { // key -> ID
		t.Helper()
		var ls []letterJSON
		if err := json.Unmarshal([]byte(dlqCmd("list", "--json")), &ls); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, l := range ls {
			out[l.Key] = l.ID
		}
		return out
	}
	before := ids()
	if len(before) != 4 {
		t.Fatalf("listed %v, want 4 dead letters", before)
	}
	if out := dlqCmd("replay", before["s-1"]); out != "replayed 1 dead letter\n" {
		t.Fatalf("replay %s: %q", before["s-1"], out)
	}
	var res struct {
		Command string       `json:"command"`
		DryRun  bool         `json:"dry_run"`
		Done    int          `json:"done"`
		Letters []letterJSON `json:"letters"`
	}
	if err := json.Unmarshal([]byte(dlqCmd("purge", "--dry-run", "--json", before["s-2"])), &res); err != nil ||
		res.Command != "purge" || !res.DryRun || res.Done != 0 || len(res.Letters) != 1 || res.Letters[0].Key != "s-2" {
		t.Fatalf("purge --dry-run --json %s: %+v, %v", before["s-2"], res, err)
	}
	after := ids()
	for _, k := range []string{"s-2", "s-3", "s-4"} {
		if after[k] != before[k] {
			t.Errorf("the ID of %s was %q, is %q after the replay of s-1", k, before[k], after[k])
		}
	}
	if _, ok := after["s-1"]; ok || len(after) != 3 {
		t.Errorf("after the replay of s-1: %v", after)
	}
	if err := json.Unmarshal([]byte(dlqCmd("purge", "--json", before["s-3"], "s-4")), &res); err != nil ||
		res.Command != "purge" || res.DryRun || res.Done != 2 || len(res.Letters) != 2 {
		t.Fatalf("purge --json %s s-4: %+v, %v", before["s-3"], res, err)
	}
	if out := dlqCmd("show", before["s-2"]); !strings.Contains(out, "key:              s-2") {
		t.Errorf("show %s:\n%s", before["s-2"], out)
	}
	if out := dlqCmd("list"); !strings.HasSuffix(out, "\n1 dead letter\n") {
		t.Errorf("list:\n%s", out)
	}
}

// rabbitDLQ is an origin queue and its dead-letter queue on the test's
// RabbitMQ, deleted when the test ends, and a channel in confirm mode.
type rabbitDLQ struct {
	url, queue, dead string
	ch               *amqp.Channel
}

// newRabbitDLQ declares a queue named after prefix and the test, and its
// "<queue>.dlq".
func newRabbitDLQ(t *testing.T, prefix string) *rabbitDLQ {
	t.Helper()
	r := &rabbitDLQ{url: testenv.AMQPURL(t), queue: runtest.UniqueName(t, prefix)}
	r.dead = r.queue + ".dlq"
	brokerenv.DeleteQueuesAtCleanup(t, r.url, r.queue, r.dead)
	conn, err := amqp.Dial(r.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if r.ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{r.queue, r.dead} {
		if _, err := r.ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return r
}

// deadLetter publishes a persistent dead letter with body and headers to
// the dead-letter queue and waits for the broker's confirm.
func (r *rabbitDLQ) deadLetter(t *testing.T, body string, headers amqp.Table) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dc, err := r.ch.PublishWithDeferredConfirmWithContext(ctx, "", r.dead, true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, Body: []byte(body), Headers: headers,
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish not confirmed: %v", err)
	}
}

// cmd runs idemq dlq args on the dead-letter queue and returns its stdout;
// it fails t unless idemq exits 0.
func (r *rabbitDLQ) cmd(t *testing.T, args ...string) string {
	t.Helper()
	args = append(append([]string{"dlq"}, args...), "--broker", "rabbitmq", "--amqp-url", r.url, "--dlq", r.dead)
	code, out, errOut := idemq(t, args...)
	if code != exitOK {
		t.Fatalf("idemq %s = %d:\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}
