package sqssource_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sqssource"
)

// keyAttribute is the message attribute the tests put deduplication keys in.
const keyAttribute = "idemq-key"

// needServices skips t in -short mode, which runs the tests that need no
// service. Without -short a missing service fails the test (see testenv).
func needServices(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs ElasticMQ and PostgreSQL; run without -short")
	}
}

// testContext returns a context cancelled after d or when t ends.
func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

var (
	clientOnce sync.Once
	client     *sqs.Client
	clientErr  error
)

// sqsClient returns a client for the test SQS server, shared by all tests.
func sqsClient(t testing.TB) *sqs.Client {
	t.Helper()
	needServices(t)
	endpoint := testenv.SQSEndpoint(t)
	clientOnce.Do(func() { client, clientErr = newClient(endpoint) })
	if clientErr != nil {
		t.Fatalf("SQS client: %v", clientErr)
	}
	return client
}

// newClient returns a client for the local SQS-compatible server at endpoint.
func newClient(endpoint string) (*sqs.Client, error) {
	return sqssource.NewClient(context.Background(), endpoint,
		config.WithRegion(testenv.SQSRegion),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(
			testenv.SQSAccessKeyID, testenv.SQSSecretAccessKey, "")),
	)
}

// queueOptions describe a test queue.
type queueOptions struct {
	FIFO bool
	// MaxReceiveCount > 0 gives the queue a redrive policy to its
	// dead-letter queue.
	MaxReceiveCount int
}

// testQueue is a queue and its dead-letter queue, deleted when the test ends.
type testQueue struct {
	Name, URL string
	DLQName   string
	DLQURL    string
	FIFO      bool
}

// newQueue creates a queue and its dead-letter queue.
func newQueue(t testing.TB, opt queueOptions) testQueue {
	t.Helper()
	c := sqsClient(t)
	ctx := testContext(t, 30*time.Second)
	name := runtest.UniqueName(t, "")
	q := testQueue{Name: name, DLQName: name + "-dlq", FIFO: opt.FIFO}
	suffix := ""
	attrs := map[string]string{}
	if opt.FIFO {
		suffix = ".fifo"
		attrs[string(types.QueueAttributeNameFifoQueue)] = "true"
		q.Name += suffix
		q.DLQName += suffix
	}
	q.DLQURL = createQueue(ctx, t, c, q.DLQName, attrs)
	if opt.MaxReceiveCount > 0 {
		out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
			QueueUrl: aws.String(q.DLQURL), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
		})
		if err != nil {
			t.Fatalf("dead-letter queue ARN: %v", err)
		}
		arn := out.Attributes[string(types.QueueAttributeNameQueueArn)]
		attrs[string(types.QueueAttributeNameRedrivePolicy)] = fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"%d"}`, arn, opt.MaxReceiveCount)
	}
	q.URL = createQueue(ctx, t, c, q.Name, attrs)
	return q
}

func createQueue(ctx context.Context, t testing.TB, c *sqs.Client, name string, attrs map[string]string) string {
	t.Helper()
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("create queue %s: %v", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
			t.Logf("delete queue %s: %v", name, err)
		}
	})
	return url
}

// outMsg is a message to publish.
type outMsg struct {
	Key     string
	Body    string
	Group   string // FIFO MessageGroupId; defaults to "g"
	DedupID string // FIFO MessageDeduplicationId; defaults to a random one
	Headers map[string]string
}

// publish sends msgs to the queue, in order, 10 per SendMessageBatch.
func publish(t testing.TB, queueURL string, fifo bool, msgs ...outMsg) {
	t.Helper()
	publishWith(t, sqsClient(t), queueURL, fifo, msgs...)
}

// publishWith is publish through the client c.
func publishWith(t testing.TB, c *sqs.Client, queueURL string, fifo bool, msgs ...outMsg) {
	t.Helper()
	ctx := testContext(t, 60*time.Second)
	for start := 0; start < len(msgs); start += 10 {
		batch := msgs[start:min(start+10, len(msgs))]
		entries := make([]types.SendMessageBatchRequestEntry, len(batch))
		for i, m := range batch {
			attrs := map[string]types.MessageAttributeValue{}
			if m.Key != "" {
				attrs[keyAttribute] = stringAttr(m.Key)
			}
			for k, v := range m.Headers {
				attrs[k] = stringAttr(v)
			}
			e := types.SendMessageBatchRequestEntry{
				Id:                aws.String(strconv.Itoa(i)),
				MessageBody:       aws.String(m.Body),
				MessageAttributes: attrs,
			}
			if fifo {
				g, d := m.Group, m.DedupID
				if g == "" {
					g = "g"
				}
				if d == "" {
					d = rand.Text()
				}
				e.MessageGroupId, e.MessageDeduplicationId = aws.String(g), aws.String(d)
			}
			entries[i] = e
		}
		out, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		if len(out.Failed) > 0 {
			t.Fatalf("publish: %d entries failed, first: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
	}
}

func stringAttr(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// numbered returns n messages with keys prefix-000, prefix-001, ...
func numbered(prefix string, n int) []outMsg {
	out := make([]outMsg, n)
	for i := range out {
		key := fmt.Sprintf("%s-%03d", prefix, i)
		out[i] = outMsg{Key: key, Body: fmt.Sprintf(`{"key":%q,"n":%d}`, key, i)}
	}
	return out
}

// queueDepth returns the visible plus in-flight messages of a queue.
func queueDepth(t testing.TB, queueURL string) int {
	t.Helper()
	return queueDepthWith(t, sqsClient(t), queueURL)
}

// queueDepthWith is queueDepth through the client c.
func queueDepthWith(t testing.TB, c *sqs.Client, queueURL string) int {
	t.Helper()
	ctx := testContext(t, 10*time.Second)
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(queueURL),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
		},
	})
	if err != nil {
		t.Fatalf("queue attributes: %v", err)
	}
	n := 0
	for _, v := range out.Attributes {
		k, _ := strconv.Atoi(v)
		n += k
	}
	return n
}

// drain receives every message of a queue (for dead-letter queues), waiting
// until want distinct messages arrived or timeout passed, and returns them,
// each once. It hides what it received for drainVisibility only, and counts
// a message received again by its MessageId: a receive whose response is
// lost on a loaded machine (the SDK retries it) must not hide a message
// past the test's end.
func drain(t testing.TB, queueURL string, want int, timeout time.Duration) []types.Message {
	t.Helper()
	c := sqsClient(t)
	ctx := testContext(t, timeout+10*time.Second)
	deadline := time.Now().Add(timeout)
	var got []types.Message
	seen := map[string]bool{}
	for len(got) < want && time.Now().Before(deadline) {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: drainVisibility,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatalf("drain %s: %v", queueURL, err)
		}
		for _, m := range out.Messages {
			if id := aws.ToString(m.MessageId); !seen[id] {
				seen[id] = true
				got = append(got, m)
			}
		}
	}
	return got
}

// drainVisibility is how long, in seconds, drain hides a message it
// received.
const drainVisibility = 5

// sourceConfig returns the configuration the tests use for q: short
// timeouts, the test key attribute, and q's dead-letter queue.
func sourceConfig(t testing.TB, q testQueue) sqssource.Config {
	return sqssource.Config{
		QueueURL:           q.URL,
		DeadLetterQueueURL: q.DLQURL,
		KeyAttribute:       keyAttribute,
		VisibilityTimeout:  4 * time.Second,
		WaitTime:           1 * time.Second,
		Logger:             runtest.Logger(t),
	}
}

// newSource opens a source that is closed when the test ends.
func newSource(t testing.TB, cfg sqssource.Config) *sqssource.Source {
	t.Helper()
	src, err := sqssource.New(testContext(t, 30*time.Second), sqsClient(t), cfg)
	if err != nil {
		t.Fatalf("sqssource.New: %v", err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// database is a fresh schema with a dedup store and an effects table.
type database struct {
	Pool   *pgxpool.Pool
	Store  *pgdedup.Store
	Schema string
	URL    string
}

// newDatabase creates a schema (dropped at the end of the test) holding the
// dedup store's table and an effects table:
//
//	effects(id bigserial, key text, grp text, n int, worker text)
func newDatabase(t testing.TB) database {
	t.Helper()
	needServices(t)
	base := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, base)
	url, err := testenv.WithSearchPath(base, schema)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t, 30*time.Second)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("pgxpool: %v", err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL, grp text, n int, worker text)`); err != nil {
		t.Fatalf("create effects: %v", err)
	}
	return database{Pool: pool, Store: store, Schema: schema, URL: url}
}

// recordEffect is a handler that inserts one effects row per message.
func recordEffect(worker string) consumer.TxHandler[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, grp, n, worker) VALUES ($1, $2, $3, $4)`,
			msg.Key, msg.PartitionKey, msg.Attempt, worker)
		return err
	}
}

// effectCounts returns the number of effect rows and of distinct keys.
func effectCounts(t testing.TB, db database) (rows, keys int) {
	t.Helper()
	ctx := testContext(t, 10*time.Second)
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT key) FROM effects`).Scan(&rows, &keys); err != nil {
		t.Fatalf("count effects: %v", err)
	}
	return rows, keys
}

// runner is a consumer.Runner running in the background (runtest.Start).
type runner struct {
	*consumer.Runner
	halt func()
}

// startRunner runs a runner over src until stop is called or the test ends.
func startRunner(t testing.TB, src consumer.Source, path consumer.Path, cfg consumer.Config) *runner {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "sqssource-test"
	}
	if cfg.Logger == nil {
		cfg.Logger = runtest.Logger(t)
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	r, err := consumer.NewRunner(src, path, cfg)
	if err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	return &runner{Runner: r, halt: runtest.Start(t, r)}
}

// stop cancels the runner and waits for Run to return. It may be called more
// than once.
func (r *runner) stop() { r.halt() }
