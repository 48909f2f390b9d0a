package sqsdlq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/internal/dlqtest"
	"github.com/idemq/idemq/sources/sqssource"
	"github.com/idemq/idemq/sources/sqssource/sqsdlq"
)

// TestHelperReplayChild is TestSQS's replay child (see
// dlqtest.ReplayChild): it is killed as it deletes a dead letter.
func TestHelperReplayChild(t *testing.T) {
	dlqtest.ReplayChild(t, func(t *testing.T, env func(string) string) dlq.Broker {
		// The child's scan hides what it received for 1 s only, so that
		// what it held when killed comes back soon.
		c := sqsClient(env("IDEMQ_DLQ_SQS_ENDPOINT"), func(o *sqs.Options) {
			o.HTTPClient = &killingHTTP{Doer: awshttp.NewBuildableClient()}
		})
		return openSQSDLQ(t, c, env("IDEMQ_DLQ_QUEUE_URL"), time.Second)
	})
}

// New refuses a configuration without its required fields with one
// *idemq.ConfigError per field.
func TestNewRefusesMissingFields(t *testing.T) {
	_, err := sqsdlq.New(sqsdlq.Config{})
	dlqtest.CheckMissingFields(t, err, "sqsdlq.Config.Client", "sqsdlq.Config.QueueURL")
}

// killingHTTP SIGKILLs the process as it is about to delete a dead letter
// past the ones the child may remove (dlqtest.KillAtRemoval): its copy is in
// the origin queue, the dead letter not deleted.
type killingHTTP struct {
	Doer interface {
		Do(*http.Request) (*http.Response, error)
	}
	deletes atomic.Int64
}

func (k *killingHTTP) Do(r *http.Request) (*http.Response, error) {
	if r.Header.Get("X-Amz-Target") == "AmazonSQS.DeleteMessage" {
		dlqtest.KillAtRemoval(&k.deletes)
	}
	return k.Doer.Do(r)
}

func sqsClient(endpoint string, opts ...func(*sqs.Options)) *sqs.Client {
	return sqs.New(sqs.Options{
		Region: testenv.SQSRegion, BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider(testenv.SQSAccessKeyID, testenv.SQSSecretAccessKey, ""),
	}, opts...)
}

func openSQSDLQ(t *testing.T, c *sqs.Client, url string, vis time.Duration) *sqsdlq.Broker {
	t.Helper()
	b, err := sqsdlq.New(sqsdlq.Config{Client: c, QueueURL: url, KeyAttribute: "idempotency-key", ScanVisibility: vis})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSQS(t *testing.T) {
	endpoint := testenv.SQSEndpoint(t)
	c := sqsClient(endpoint)
	name := runtest.UniqueName(t, "idemq-dlq")
	brokerenv.DeleteSQSQueuesAtCleanup(t, endpoint, name, name+"-dlq")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var urls [2]string
	for i, n := range []string{name, name + "-dlq"} {
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(n)})
		if err != nil {
			t.Fatal(err)
		}
		urls[i] = aws.ToString(out.QueueUrl)
	}
	queue, dead := urls[0], urls[1]
	str := func(s string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
	}
	dlqtest.RunScenario(t, dlqtest.Rig{
		Publish: func(t *testing.T, key, body string) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(body),
				MessageAttributes: map[string]types.MessageAttributeValue{"idempotency-key": str(key), "tenant": str("acme")}}); err != nil {
				t.Fatal(err)
			}
		},
		Source: func(t *testing.T) consumer.Source {
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
		Broker: func(t *testing.T) dlq.Broker { return openSQSDLQ(t, c, dead, 0) },
		// A second copy of each dead letter: replayed as well, absorbed.
		Again: func(t *testing.T, b dlq.Broker) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var copies []types.SendMessageBatchRequestEntry
			for len(copies) < len(dlqtest.Poison) {
				out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(dead), MaxNumberOfMessages: 10,
					WaitTimeSeconds: 1, VisibilityTimeout: 30, MessageAttributeNames: []string{"All"}})
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range out.Messages {
					copies = append(copies, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(len(copies))),
						MessageBody: m.Body, MessageAttributes: m.MessageAttributes})
					if _, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(dead),
						ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if _, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(dead), Entries: copies}); err != nil {
				t.Fatal(err)
			}
		},
		AgainBefore:  true,
		ChildEnv:     []string{"IDEMQ_DLQ_SQS_ENDPOINT=" + endpoint, "IDEMQ_DLQ_QUEUE_URL=" + dead},
		KillInWindow: true,
	})
}

// A FIFO queue keyed on the deduplication id (no KeyAttribute): a replayed
// dead letter keeps the key the runner recorded, so a replay of a message
// applied meanwhile is absorbed, and two dead letters of one message (the
// second written when deleting the original failed, past the dead-letter
// queue's deduplication interval) take effect once.
func TestSQSFIFOReplayKeepsKey(t *testing.T) {
	endpoint := testenv.SQSEndpoint(t)
	c := sqsClient(endpoint)
	name := runtest.UniqueName(t, "idemq-dlq")
	brokerenv.DeleteSQSQueuesAtCleanup(t, endpoint, name+".fifo", name+"-dlq.fifo")
	ctx, cancel := context.WithTimeout(context.Background(), 2*dlqtest.WaitTimeout)
	defer cancel()
	var urls [2]string
	for i, n := range []string{name + ".fifo", name + "-dlq.fifo"} {
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(n),
			Attributes: map[string]string{string(types.QueueAttributeNameFifoQueue): "true"}})
		if err != nil {
			t.Fatal(err)
		}
		urls[i] = aws.ToString(out.QueueUrl)
	}
	queue, dead := urls[0], urls[1]
	// order-2 and order-3 are poison (see dlqtest.Poison) while broken is set.
	keys := []string{dlqtest.KeyOf(1), dlqtest.KeyOf(2), dlqtest.KeyOf(3)}
	for _, k := range keys {
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(`{"order":"` + k + `"}`),
			MessageGroupId: aws.String(k), MessageDeduplicationId: aws.String(k),
			MessageAttributes: map[string]types.MessageAttributeValue{
				"tenant": {DataType: aws.String("String"), StringValue: aws.String("acme")}}}); err != nil {
			t.Fatal(err)
		}
	}
	// run runs a runner until done, then closes its source. A message that
	// SQS handed to one of its receive calls that Close cancelled comes
	// back after the visibility timeout, which is short for that reason.
	db := dlqtest.NewEffectsDB(t)
	var broken atomic.Bool
	run := func(t *testing.T, done func(consumer.Stats) bool) consumer.Stats {
		src, err := sqssource.New(ctx, c, sqssource.Config{QueueURL: queue, DeadLetterQueueURL: dead,
			WaitTime: time.Second, VisibilityTimeout: 2 * time.Second, Logger: runtest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		r := db.Runner(t, src, &broken)
		runtest.RunUntil(t, func() bool { return done(r.Stats()) }, r)
		return r.Stats()
	}
	broken.Store(true)
	run(t, func(st consumer.Stats) bool { return st.Handled >= 1 && st.DeadLettered >= 2 })

	// A second dead letter of each poison message, with a deduplication
	// id of its own.
	var copies []types.SendMessageBatchRequestEntry
	for len(copies) < 2 {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(dead), MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, VisibilityTimeout: 30, MessageAttributeNames: []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			copies = append(copies, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(len(copies))),
				MessageBody: m.Body, MessageAttributes: m.MessageAttributes,
				MessageGroupId:         aws.String(m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]),
				MessageDeduplicationId: aws.String("copy-" + aws.ToString(m.MessageId))})
			if _, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(dead),
				ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(dead), Entries: copies}); err != nil {
		t.Fatal(err)
	}

	b := openSQSDLQ(t, c, dead, 0)
	if got, want := dlqtest.KeysOf(dlqtest.List(t, b, dlq.Filter{})), []string{dlqtest.KeyOf(2), dlqtest.KeyOf(2), dlqtest.KeyOf(3), dlqtest.KeyOf(3)}; !slices.Equal(got, want) {
		t.Errorf("dead-letter keys %v, want the recorded keys %v", got, want)
	}
	broken.Store(false)
	// One dead letter of each replayed and applied, then the other two.
	for round, sel := range []dlq.Filter{{Key: dlqtest.KeyOf(2), Limit: 1}, {Key: dlqtest.KeyOf(3), Limit: 1}, {}} {
		res, err := dlq.Replay(ctx, b, sel, dlq.Options{})
		if err != nil {
			t.Fatalf("replay %+v: %v", sel, err)
		}
		st := run(t, func(st consumer.Stats) bool { return st.Received >= uint64(res.Done) })
		t.Logf("replay %d sent %d (dead-letter queue then: %s); the runner: %+v", round, res.Done, queueCounts(ctx, c, dead), st)
	}
	if ls := dlqtest.List(t, b, dlq.Filter{}); len(ls) != 0 {
		t.Errorf("%d dead letters left: %v", len(ls), dlqtest.KeysOf(ls))
	}
	eff := db.Effects(t)
	want := map[string]int{dlqtest.KeyOf(1): 1, dlqtest.KeyOf(2): 1, dlqtest.KeyOf(3): 1}
	if !maps.Equal(eff, want) {
		t.Errorf("effects by key %v, want %v (dead-letter queue: %s)", eff, want, queueCounts(ctx, c, dead))
	}
}

// queueCounts describes how many messages the queue at url holds, visible
// and in flight: a dead letter that a scan missed is either gone or hidden.
func queueCounts(ctx context.Context, c *sqs.Client, url string) string {
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		return err.Error()
	}
	return out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)] + " visible, " +
		out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)] + " in flight"
}

// allowPolicyHTTP gives the queue queueURL the RedriveAllowPolicy policy in
// GetQueueAttributes responses, which ElasticMQ neither stores nor returns.
type allowPolicyHTTP struct {
	queueURL, policy string
}

func (p *allowPolicyHTTP) Do(r *http.Request) (*http.Response, error) {
	if r.Header.Get("X-Amz-Target") != "AmazonSQS.GetQueueAttributes" {
		return http.DefaultClient.Do(r)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(r)
	var in struct{ QueueUrl string }
	if err != nil || json.Unmarshal(body, &in) != nil || in.QueueUrl != p.queueURL || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	defer resp.Body.Close()
	var out struct{ Attributes map[string]string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if out.Attributes == nil {
		out.Attributes = map[string]string{}
	}
	out.Attributes[string(types.QueueAttributeNameRedriveAllowPolicy)] = p.policy
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	resp.Header.Del("Content-Length")
	return resp, nil
}

// moveRig is a dead-letter queue that the queue orders, and the queue
// refunds unless told otherwise, name in their redrive policies.
type moveRig struct {
	c                     *sqs.Client
	dead, orders, refunds string
	// sent are the dead letters' bodies by origin URL.
	sent map[string][]string
}

func newMoveRig(t *testing.T, endpoint string, refundsRedrive bool) *moveRig {
	t.Helper()
	c := sqsClient(endpoint)
	name := runtest.UniqueName(t, "idemq-move")
	brokerenv.DeleteSQSQueuesAtCleanup(t, endpoint, name+"-dlq", name+"-orders", name+"-refunds")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	create := func(n string, attrs map[string]string) string {
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(n), Attributes: attrs})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(out.QueueUrl)
	}
	rg := &moveRig{c: c, dead: create(name+"-dlq", nil), sent: map[string][]string{}}
	deadARN := queueARN(t, c, rg.dead)
	redrive := map[string]string{string(types.QueueAttributeNameRedrivePolicy): `{"deadLetterTargetArn":"` + deadARN + `","maxReceiveCount":"5"}`}
	rg.orders = create(name+"-orders", redrive)
	if !refundsRedrive {
		redrive = nil
	}
	rg.refunds = create(name+"-refunds", redrive)
	return rg
}

func queueARN(t *testing.T, c *sqs.Client, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	return out.Attributes[string(types.QueueAttributeNameQueueArn)]
}

// deadLetter writes a dead letter of origin, as sqssource does.
func (rg *moveRig) deadLetter(t *testing.T, origin string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body := fmt.Sprintf(`{"from":%q,"n":%d}`, origin, len(rg.sent[origin]))
	str := func(s string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
	}
	if _, err := rg.c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(rg.dead), MessageBody: aws.String(body),
		MessageAttributes: map[string]types.MessageAttributeValue{consumer.MetaReason: str("bad SKU"), sqssource.MetaOriginQueue: str(origin),
			sqssource.MetaOriginMessageID: str(body), consumer.MetaAttempts: {DataType: aws.String("Number"), StringValue: aws.String("3")}}}); err != nil {
		t.Fatal(err)
	}
	rg.sent[origin] = append(rg.sent[origin], body)
}

// holds returns the bodies in queue url.
func (rg *moveRig) holds(t *testing.T, url string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []string
	for {
		m, err := rg.c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 30})
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Messages) == 0 {
			slices.Sort(out)
			return out
		}
		for _, m := range m.Messages {
			out = append(out, aws.ToString(m.Body))
		}
	}
}

// A dead-letter queue that two queues can feed is never moved whole to one
// of them: a dead letter of refunds, written after the letters of orders
// were listed, goes back to refunds.
func TestSQSMoveAllKeepsOrigins(t *testing.T) {
	rg := newMoveRig(t, testenv.SQSEndpoint(t), true)
	rg.deadLetter(t, rg.orders)
	rg.deadLetter(t, rg.orders)
	b := openSQSDLQ(t, rg.c, rg.dead, 0)
	// What the command line's replay saw: letters of orders only.
	for _, l := range dlqtest.List(t, b, dlq.Filter{}) {
		if l.Origin != rg.orders {
			t.Fatalf("dead letter %+v: origin %q, want %q", l, l.Origin, rg.orders)
		}
	}
	rg.deadLetter(t, rg.refunds)

	ctx, cancel := context.WithTimeout(context.Background(), dlqtest.WaitTimeout)
	defer cancel()
	moved, err := b.MoveAll(ctx, rg.orders, nil)
	switch {
	case errors.Is(err, sqsdlq.ErrNativeUnsupported):
		t.Logf("MoveAll refused: %v", err)
		if !errors.Is(err, sqsdlq.ErrNativeUnsafe) {
			t.Errorf("MoveAll: %v, want ErrNativeUnsafe (ElasticMQ has message-move tasks)", err)
		}
		if _, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{}); err != nil {
			t.Fatalf("replay: %v", err)
		}
	case err != nil:
		t.Fatalf("MoveAll: %v", err)
	default:
		t.Logf("MoveAll moved %d", moved)
	}
	for _, q := range []string{rg.orders, rg.refunds} {
		if got := rg.holds(t, q); !slices.Equal(got, rg.sent[q]) {
			t.Errorf("%s holds %q, want its own dead letters %q", q, got, rg.sent[q])
		}
	}
}

// With a RedriveAllowPolicy that names one source queue, MoveAll moves the
// whole dead-letter queue there with a message-move task, and refuses any
// other destination.
func TestSQSMoveAllToTheOnlySource(t *testing.T) {
	endpoint := testenv.SQSEndpoint(t)
	// Only orders names the dead-letter queue, as its policy says.
	rg := newMoveRig(t, endpoint, false)
	ctx, cancel := context.WithTimeout(context.Background(), dlqtest.WaitTimeout)
	defer cancel()
	policy := `{"redrivePermission":"byQueue","sourceQueueArns":["` + queueARN(t, rg.c, rg.orders) + `"]}`
	c := sqsClient(endpoint, func(o *sqs.Options) { o.HTTPClient = &allowPolicyHTTP{queueURL: rg.dead, policy: policy} })
	b := openSQSDLQ(t, c, rg.dead, 0)
	rg.deadLetter(t, rg.orders)
	rg.deadLetter(t, rg.orders)

	if _, err := b.MoveAll(ctx, rg.refunds, nil); !errors.Is(err, sqsdlq.ErrNativeUnsafe) {
		t.Errorf("MoveAll to refunds: %v, want ErrNativeUnsafe", err)
	}
	moved, err := b.MoveAll(ctx, "", nil)
	if err != nil {
		t.Fatalf("MoveAll: %v", err)
	}
	if got := rg.holds(t, rg.orders); moved != 2 || !slices.Equal(got, rg.sent[rg.orders]) {
		t.Errorf("moved %d; orders holds %q, want %q", moved, got, rg.sent[rg.orders])
	}
	if got := rg.holds(t, rg.refunds); len(got) != 0 {
		t.Errorf("refunds holds %q, want nothing", got)
	}
}

// failHTTP fails the fail-th request of the operation op (such as
// "SendMessage") without sending it.
type failHTTP struct {
	op    string
	fail  int64
	calls atomic.Int64
}

func (f *failHTTP) Do(r *http.Request) (*http.Response, error) {
	if r.Header.Get("X-Amz-Target") == "AmazonSQS."+f.op && f.calls.Add(1) == f.fail {
		return nil, errors.New("injected failure")
	}
	return http.DefaultClient.Do(r)
}

// A scan that a failed replay or delete, or a cancelled ctx, stops halfway
// through a receive makes every dead letter of it that it did not replay visible
// again at once, not after Config.ScanVisibility: a list or replay run
// right after sees them all.
func TestSQSScanReleasesTheRestOfABatch(t *testing.T) {
	endpoint := testenv.SQSEndpoint(t)
	for _, c := range []struct {
		name string
		// scan replays the dead letters of b until it fails.
		scan func(ctx context.Context, b *sqsdlq.Broker) (int, error)
		// The fail-th request of op fails.
		op     string
		fail   int64
		copies int // in the origin queue after the scan
	}{
		{"replay fails", replayAll, "SendMessage", 2, 1},
		// The second dead letter's copy was sent: the next replay sends
		// it again.
		{"delete fails", replayAll, "DeleteMessage", 2, 2},
		{"ctx cancelled", func(ctx context.Context, b *sqsdlq.Broker) (int, error) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			visits := 0
			return b.Scan(ctx, func(*dlq.Letter) dlq.Action {
				if visits++; visits == 2 {
					cancel()
				}
				return dlq.ActionReplay
			})
		}, "", 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			rg := newMoveRig(t, endpoint, false)
			const letters = 4
			for range letters {
				rg.deadLetter(t, rg.orders)
			}
			fc := sqsClient(endpoint, func(o *sqs.Options) {
				o.HTTPClient, o.Retryer = &failHTTP{op: c.op, fail: c.fail}, aws.NopRetryer{}
			})
			// The default ScanVisibility (60 s), longer than the test
			// waits.
			b, err := sqsdlq.New(sqsdlq.Config{Client: fc, QueueURL: rg.dead})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), dlqtest.WaitTimeout)
			defer cancel()
			done, err := c.scan(ctx, b)
			if err == nil || done != 1 {
				t.Fatalf("scan: %d done, %v; want 1 done and an error", done, err)
			}
			t.Logf("scan stopped: %v", err)
			if ls := dlqtest.List(t, openSQSDLQ(t, rg.c, rg.dead, 0), dlq.Filter{}); len(ls) != letters-done {
				t.Errorf("%d dead letters listed after the scan, want %d (dead-letter queue: %s)", len(ls), letters-done, queueCounts(ctx, rg.c, rg.dead))
			}
			if got := rg.holds(t, rg.orders); len(got) != c.copies {
				t.Errorf("orders holds %q, want %d copies", got, c.copies)
			}
		})
	}
}

func replayAll(ctx context.Context, b *sqsdlq.Broker) (int, error) {
	res, err := dlq.Replay(ctx, b, dlq.Filter{}, dlq.Options{})
	return res.Done, err
}

// hangReleaseHTTP never answers ChangeMessageVisibilityBatch: it returns
// when the request's ctx ends.
type hangReleaseHTTP struct{}

func (hangReleaseHTTP) Do(r *http.Request) (*http.Response, error) {
	if r.Header.Get("X-Amz-Target") == "AmazonSQS.ChangeMessageVisibilityBatch" {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return http.DefaultClient.Do(r)
}

// A scan whose ctx is cancelled still releases what it kept, but not for
// ever when the endpoint does not answer: it gives up at the first request
// that times out, and reports that the rest reappear later.
func TestSQSScanReleaseIsBounded(t *testing.T) {
	endpoint := testenv.SQSEndpoint(t)
	rg := newMoveRig(t, endpoint, false)
	const letters = 2*sqssource.MaxBatch + 1 // three release requests
	for range letters {
		rg.deadLetter(t, rg.orders)
	}
	b := openSQSDLQ(t, sqsClient(endpoint, func(o *sqs.Options) { o.HTTPClient = hangReleaseHTTP{} }), rg.dead, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	visits := 0
	start := time.Now()
	_, err := b.Scan(ctx, func(*dlq.Letter) dlq.Action {
		if visits++; visits == letters {
			cancel()
		}
		return dlq.ActionKeep
	})
	took := time.Since(start)
	t.Logf("scan took %s: %v", took, err)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("scan: %v; want the cancelled ctx and the release's timeout", err)
	}
	if took > 20*time.Second {
		t.Errorf("scan took %s; want the release to give up after its first timeout", took)
	}
}
