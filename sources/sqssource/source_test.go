package sqssource_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/sqssource"
)

// receiveN receives from src until n messages arrived or timeout passed.
func receiveN(t *testing.T, src consumer.Source, n int, timeout time.Duration) []*consumer.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []*consumer.Message
	for len(got) < n {
		msgs, err := src.Receive(ctx, n-len(got))
		if err != nil {
			t.Fatalf("received %d of %d messages: %v", len(got), n, err)
		}
		got = append(got, msgs...)
	}
	return got
}

func TestNewChecksQueueAndDeadLetterRoute(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	ctx := testContext(t, 30*time.Second)
	std := newQueue(t, queueOptions{})
	fifo := newQueue(t, queueOptions{FIFO: true})
	redrive := newQueue(t, queueOptions{MaxReceiveCount: 4})

	tests := []struct {
		name string
		cfg  sqssource.Config
		want error
	}{
		{"no queue", sqssource.Config{}, idemq.ErrInvalidConfig},
		{"visibility not whole seconds", sqssource.Config{QueueURL: std.URL, DeadLetterQueueURL: std.DLQURL, VisibilityTimeout: 1500 * time.Millisecond}, idemq.ErrInvalidConfig},
		{"wait above 20s", sqssource.Config{QueueURL: std.URL, DeadLetterQueueURL: std.DLQURL, WaitTime: 21 * time.Second}, idemq.ErrInvalidConfig},
		{"heartbeat too slow", sqssource.Config{QueueURL: std.URL, DeadLetterQueueURL: std.DLQURL, VisibilityTimeout: 10 * time.Second, HeartbeatInterval: 6 * time.Second}, idemq.ErrInvalidConfig},
		{"no dead-letter route", sqssource.Config{QueueURL: std.URL}, sqssource.ErrNoDeadLetterRoute},
		{"standard queue, FIFO dead letters", sqssource.Config{QueueURL: std.URL, DeadLetterQueueURL: fifo.DLQURL}, idemq.ErrInvalidConfig},
	}
	for _, tc := range tests {
		_, err := sqssource.New(ctx, c, tc.cfg)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: New returned %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := sqssource.New(ctx, c, sqssource.Config{QueueURL: std.URL + "-missing", DeadLetterQueueURL: std.DLQURL}); err == nil {
		t.Errorf("New accepted a queue that does not exist")
	}

	src := newSource(t, sqssource.Config{QueueURL: redrive.URL})
	if got := src.MaxReceiveCount(); got != 4 {
		t.Errorf("MaxReceiveCount = %d, want 4", got)
	}
	if src.FIFO() {
		t.Errorf("standard queue reported as FIFO")
	}
	if !newSource(t, sourceConfig(t, fifo)).FIFO() {
		t.Errorf("FIFO queue not reported as FIFO")
	}
}

func TestMessageFieldsAndRetryAttempt(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	cfg := sourceConfig(t, q)
	cfg.PartitionKeyAttribute = "account"
	src := newSource(t, cfg)
	publish(t, q.URL, false, outMsg{Key: "k1", Body: "hello", Headers: map[string]string{"trace": "abc", "account": "42"}})

	first := receiveN(t, src, 1, 20*time.Second)[0]
	if first.Key != "k1" || string(first.Body) != "hello" || first.Headers["trace"] != "abc" || first.PartitionKey != "42" ||
		first.Attempt != 1 || first.Redelivered || first.ID == "" || first.Topic != q.Name {
		t.Fatalf("first delivery = %+v", first)
	}
	ctx := testContext(t, 10*time.Second)
	if err := src.Retry(ctx, first, time.Second); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	second := receiveN(t, src, 1, 20*time.Second)[0]
	if second.ID != first.ID || second.Key != first.Key || second.Attempt != 2 || !second.Redelivered {
		t.Fatalf("redelivery = id %q key %q attempt %d redelivered %v; want id %q key %q attempt 2",
			second.ID, second.Key, second.Attempt, second.Redelivered, first.ID, first.Key)
	}
	if err := src.Ack(ctx, []*consumer.Message{second}); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if n := queueDepth(t, q.URL); n != 0 {
		t.Fatalf("queue holds %d messages after Ack, want 0", n)
	}
	if err := src.Ack(ctx, []*consumer.Message{{ID: "x"}}); !errors.Is(err, sqssource.ErrForeignMessage) {
		t.Fatalf("Ack of a foreign message returned %v, want ErrForeignMessage", err)
	}
}

// TestAckManyAndStaleHandles deletes more than one batch of messages in one
// Ack, and checks that a delete with a receipt handle that SQS no longer
// accepts is reported, never silently counted as done, while the others
// succeed.
func TestAckManyAndStaleHandles(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	publish(t, q.URL, false, numbered("many", 25)...)
	cfg := sourceConfig(t, q)
	cfg.VisibilityTimeout = 60 * time.Second
	cfg.ReleaseTimeout = -1
	a := newSource(t, cfg)
	b := newSource(t, cfg)
	ctx := testContext(t, 60*time.Second)

	msgs := receiveN(t, a, 25, 20*time.Second)
	// Let the receive a started ahead (prefetch) end empty, then make one
	// message visible behind a's back and receive it elsewhere: a's
	// receipt handle goes stale.
	time.Sleep(cfg.WaitTime + 500*time.Millisecond)
	stale := msgs[0]
	if _, err := sqsClient(t).ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(q.URL), ReceiptHandle: stale.Raw.(types.Message).ReceiptHandle, VisibilityTimeout: 0,
	}); err != nil {
		t.Fatal(err)
	}
	again := receiveN(t, b, 1, 20*time.Second)[0]
	if again.ID != stale.ID {
		t.Fatalf("received %s, want %s", again.ID, stale.ID)
	}
	err := a.Ack(ctx, msgs)
	var be *sqssource.BatchError
	switch {
	case err == nil:
		// SQS accepts old receipt handles; ElasticMQ does not. Both are
		// fine, as long as nothing else failed.
		t.Logf("stale receipt handle accepted")
	case !errors.As(err, &be):
		t.Fatalf("Ack returned %v, want a *BatchError", err)
	case len(be.Entries) != 1 || be.Entries[0].MessageID != stale.ID:
		t.Fatalf("Ack failed for %+v, want only the stale %s", be.Entries, stale.ID)
	}
	if err := b.Ack(ctx, []*consumer.Message{again}); err != nil {
		t.Fatalf("Ack with the fresh handle: %v", err)
	}
	if n := queueDepth(t, q.URL); n != 0 {
		t.Fatalf("queue holds %d messages, want 0", n)
	}
	if s := a.Stats(); s.Deleted+s.DeleteFailures != 25 {
		t.Fatalf("stats %+v: deleted + failures != 25", s)
	}
}

// TestHeartbeatKeepsMessageHidden holds a message without settling it for
// several visibility timeouts: with the heartbeat, a competing source
// receives nothing; past MaxExtension, the message comes back.
func TestHeartbeatKeepsMessageHidden(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	cfg := sourceConfig(t, q)
	cfg.VisibilityTimeout = 2 * time.Second
	cfg.HeartbeatInterval = 500 * time.Millisecond
	cfg.MaxExtension = 8 * time.Second
	holder := newSource(t, cfg)
	other := newSource(t, cfg)
	publish(t, q.URL, false, outMsg{Key: "held", Body: "x"})

	held := receiveN(t, holder, 1, 20*time.Second)[0]
	// Two and a half visibility timeouts, well inside MaxExtension.
	ctx, cancel := context.WithTimeout(context.Background(), 5*cfg.VisibilityTimeout/2)
	msgs, err := other.Receive(ctx, 10)
	cancel()
	if err == nil {
		t.Fatalf("competing source received %d message(s) (first %s) while the heartbeat should hide it", len(msgs), msgs[0].ID)
	}
	if holder.Stats().Extended == 0 {
		t.Fatalf("no extension made: %+v", holder.Stats())
	}
	// Past MaxExtension the heartbeat gives up and the message returns.
	back := receiveN(t, other, 1, 20*time.Second)[0]
	if back.ID != held.ID || back.Attempt < 2 {
		t.Fatalf("got %s attempt %d, want %s again", back.ID, back.Attempt, held.ID)
	}
	if holder.Stats().Expired != 1 {
		t.Fatalf("stats %+v, want Expired 1", holder.Stats())
	}
}

// callFailing is a Client whose next fails ChangeMessageVisibilityBatch
// calls fail as a whole, with a plain error (a dropped connection), before
// reaching SQS.
type callFailing struct {
	sqssource.Client
	mu    sync.Mutex
	fails int
}

func (c *callFailing) ChangeMessageVisibilityBatch(ctx context.Context, in *sqs.ChangeMessageVisibilityBatchInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error) {
	c.mu.Lock()
	fail := c.fails > 0
	if fail {
		c.fails--
	}
	c.mu.Unlock()
	if fail {
		return nil, errors.New("read tcp: connection reset by peer")
	}
	return c.Client.ChangeMessageVisibilityBatch(ctx, in, optFns...)
}

// A heartbeat call that fails as a whole (not a *BatchError naming
// entries) applies to every message of the call, and none of them is given
// up: the next tick extends them again, so a competing source still
// receives nothing. Giving them up would let the message be handled twice
// at once.
func TestHeartbeatCallFailureKeepsExtending(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	cfg := sourceConfig(t, q)
	cfg.VisibilityTimeout = 2 * time.Second
	cfg.HeartbeatInterval = 500 * time.Millisecond
	cfg.MaxExtension = time.Minute
	client := &callFailing{Client: sqsClient(t), fails: 1}
	holder, err := sqssource.New(testContext(t, 30*time.Second), client, cfg)
	if err != nil {
		t.Fatalf("sqssource.New: %v", err)
	}
	t.Cleanup(func() { _ = holder.Close() })
	other := newSource(t, cfg)
	publish(t, q.URL, false, outMsg{Key: "held", Body: "x"})

	receiveN(t, holder, 1, 20*time.Second)
	// Two and a half visibility timeouts: the failed call and the later ones.
	ctx, cancel := context.WithTimeout(context.Background(), 5*cfg.VisibilityTimeout/2)
	msgs, err := other.Receive(ctx, 10)
	cancel()
	if err == nil {
		t.Fatalf("competing source received %d message(s) (first %s, attempt %d) after a failed heartbeat call; stats %+v",
			len(msgs), msgs[0].ID, msgs[0].Attempt, holder.Stats())
	}
	if st := holder.Stats(); st.ExtendFailures != 1 || st.Extended == 0 || st.Expired != 0 {
		t.Fatalf("stats %+v, want 1 extend failure, extensions after it, none expired", st)
	}
}

// TestCloseReleasesInFlightMessages checks that Close makes unsettled
// messages visible at once instead of after their (long) visibility timeout.
func TestCloseReleasesInFlightMessages(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	cfg := sourceConfig(t, q)
	cfg.VisibilityTimeout = 60 * time.Second
	publish(t, q.URL, false, numbered("release", 5)...)
	first := newSource(t, cfg)
	receiveN(t, first, 5, 20*time.Second)
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := first.Stats().Released; got != 5 {
		t.Fatalf("released %d, want 5", got)
	}
	second := newSource(t, cfg)
	again := receiveN(t, second, 5, 20*time.Second) // far less than the 60 s visibility timeout
	for _, m := range again {
		if m.Attempt != 2 {
			t.Errorf("message %s attempt %d, want 2", m.Key, m.Attempt)
		}
	}
}

// TestFIFOStrictOrderAcrossRetry checks that a FIFO group hands out one
// message at a time and that a retried message is not overtaken by the later
// messages of its group.
func TestFIFOStrictOrderAcrossRetry(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{FIFO: true})
	src := newSource(t, sourceConfig(t, q))
	var out []outMsg
	for i := range 4 {
		out = append(out, outMsg{Key: fmt.Sprintf("a%d", i), Body: "a", Group: "A"})
	}
	out = append(out, outMsg{Key: "b0", Body: "b", Group: "B"})
	publish(t, q.URL, true, out...)

	ctx := testContext(t, 60*time.Second)
	var order []string
	retried := false
	for len(order) < 5 {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		msgs, err := src.Receive(rctx, 10)
		cancel()
		if err != nil {
			t.Fatalf("Receive after %v: %v", order, err)
		}
		groups := map[string]int{}
		for _, m := range msgs {
			groups[m.PartitionKey]++
			if groups[m.PartitionKey] > 1 {
				t.Fatalf("Receive handed out two messages of group %s at once", m.PartitionKey)
			}
		}
		for _, m := range msgs {
			if m.Key == "a1" && !retried {
				retried = true
				if err := src.Retry(ctx, m, time.Second); err != nil {
					t.Fatalf("Retry: %v", err)
				}
				continue
			}
			if err := src.Ack(ctx, []*consumer.Message{m}); err != nil {
				t.Fatalf("Ack: %v", err)
			}
			if m.PartitionKey == "A" {
				order = append(order, m.Key)
			} else {
				order = append(order, "b0")
			}
		}
	}
	var groupA []string
	for _, k := range order {
		if k != "b0" {
			groupA = append(groupA, k)
		}
	}
	if want := []string{"a0", "a1", "a2", "a3"}; !slices.Equal(groupA, want) {
		t.Fatalf("group A settled in order %v, want %v", groupA, want)
	}
}

// flakyDeletes passes DeleteMessageBatch to the real server, except that it
// withholds the entries with an odd Id and reports them as failed by the
// server (not the sender), for the first failures calls.
type flakyDeletes struct {
	sqssource.Client
	failures int

	mu    sync.Mutex
	calls [][]string // entry receipt handles per call
}

func (f *flakyDeletes) DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	f.mu.Lock()
	var handles []string
	for _, e := range in.Entries {
		handles = append(handles, aws.ToString(e.ReceiptHandle))
	}
	f.calls = append(f.calls, handles)
	fail := len(f.calls) <= f.failures
	f.mu.Unlock()
	if !fail {
		return f.Client.DeleteMessageBatch(ctx, in, optFns...)
	}
	pass := &sqs.DeleteMessageBatchInput{QueueUrl: in.QueueUrl}
	var failed []types.BatchResultErrorEntry
	for i, e := range in.Entries {
		if i%2 == 1 {
			failed = append(failed, types.BatchResultErrorEntry{Id: e.Id, Code: aws.String("InternalError"), Message: aws.String("injected")})
			continue
		}
		pass.Entries = append(pass.Entries, e)
	}
	out, err := f.Client.DeleteMessageBatch(ctx, pass, optFns...)
	if err != nil {
		return nil, err
	}
	out.Failed = append(out.Failed, failed...)
	return out, nil
}

// TestAckSendsFailedEntriesAgain checks the handling of partial batch
// failures: entries that failed on the server's side are sent again, alone,
// and entries still failing after DeleteAttempts are reported and stay in the
// queue.
func TestAckSendsFailedEntriesAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		failures     int
		wantUndelete int
	}{
		{"recovers", 1, 0},
		{"gives up", 100, 1}, // 10 sent, 5 fail; 5 again, 2 fail; 2 again, 1 fails
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q := newQueue(t, queueOptions{})
			publish(t, q.URL, false, numbered("flaky", 10)...)
			flaky := &flakyDeletes{Client: sqsClient(t), failures: tc.failures}
			cfg := sourceConfig(t, q)
			cfg.VisibilityTimeout = 60 * time.Second
			cfg.DeleteAttempts = 3
			cfg.ReleaseTimeout = -1
			src, err := sqssource.New(testContext(t, 10*time.Second), flaky, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = src.Close() })
			msgs := receiveN(t, src, 10, 20*time.Second)
			err = src.Ack(testContext(t, 30*time.Second), msgs)

			var be *sqssource.BatchError
			switch {
			case tc.wantUndelete == 0 && err != nil:
				t.Fatalf("Ack: %v", err)
			case tc.wantUndelete > 0 && (!errors.As(err, &be) || len(be.Entries) != tc.wantUndelete):
				t.Fatalf("Ack returned %v, want a *BatchError with %d entries", err, tc.wantUndelete)
			}
			flaky.mu.Lock()
			calls := flaky.calls
			flaky.mu.Unlock()
			if tc.wantUndelete == 0 && (len(calls) != 2 || len(calls[1]) != 5) {
				t.Fatalf("calls %d, second with %d entries; want 2 calls, the second with the 5 failed entries", len(calls), len(calls[len(calls)-1]))
			}
			if tc.wantUndelete > 0 && len(calls) != cfg.DeleteAttempts {
				t.Fatalf("%d calls, want DeleteAttempts = %d", len(calls), cfg.DeleteAttempts)
			}
			if n := queueDepth(t, q.URL); n != tc.wantUndelete {
				t.Fatalf("queue holds %d messages, want %d", n, tc.wantUndelete)
			}
		})
	}
}

// failingSends refuses every SendMessage.
type failingSends struct{ sqssource.Client }

func (failingSends) SendMessage(context.Context, *sqs.SendMessageInput, ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	return nil, errors.New("injected: dead-letter queue unavailable")
}

// TestDeadLetterKeepsOriginalUntilWritten checks that a message whose dead
// letter could not be written is not deleted, and comes back.
func TestDeadLetterKeepsOriginalUntilWritten(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	publish(t, q.URL, false, outMsg{Key: "dl", Body: "poison"})
	cfg := sourceConfig(t, q)
	cfg.VisibilityTimeout = 1 * time.Second
	cfg.HeartbeatInterval = -1
	cfg.RedriveDelay = time.Second // the original comes back after it
	src, err := sqssource.New(testContext(t, 10*time.Second), failingSends{sqsClient(t)}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	m := receiveN(t, src, 1, 20*time.Second)[0]
	if err := src.DeadLetter(testContext(t, 10*time.Second), m, errors.New("poison")); err == nil {
		t.Fatalf("DeadLetter succeeded although the send failed")
	}
	again := receiveN(t, src, 1, 20*time.Second)[0]
	if again.ID != m.ID || again.Attempt != 2 {
		t.Fatalf("got %s attempt %d, want %s again", again.ID, again.Attempt, m.ID)
	}
	if n := len(drain(t, q.DLQURL, 1, time.Second)); n != 0 {
		t.Fatalf("%d dead letters, want none", n)
	}
}

// countedDeletes passes DeleteMessageBatch to the real server, counting the
// calls, and holds the first call back for hold.
type countedDeletes struct {
	sqssource.Client
	hold time.Duration

	mu      sync.Mutex
	entries []int // per call
}

func (c *countedDeletes) DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	c.mu.Lock()
	c.entries = append(c.entries, len(in.Entries))
	first := len(c.entries) == 1
	c.mu.Unlock()
	if first {
		time.Sleep(c.hold)
	}
	return c.Client.DeleteMessageBatch(ctx, in, optFns...)
}

// TestConcurrentAcksShareDeleteCalls checks that Acks of one message each,
// made at once (lanes at batch size 1), leave in shared DeleteMessageBatch
// calls while one is in flight, instead of one call per message, and that
// every message is deleted.
func TestConcurrentAcksShareDeleteCalls(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	const n = 20
	publish(t, q.URL, false, numbered("shared", n)...)
	client := &countedDeletes{Client: sqsClient(t), hold: time.Second}
	src, err := sqssource.New(testContext(t, 30*time.Second), client, sourceConfig(t, q))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	msgs := receiveN(t, src, n, 20*time.Second)
	ctx := testContext(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, m := range msgs {
		wg.Go(func() { errs[i] = src.Ack(ctx, []*consumer.Message{m}) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	client.mu.Lock()
	calls := slices.Clone(client.entries)
	client.mu.Unlock()
	t.Logf("entries per DeleteMessageBatch call: %v", calls)
	if len(calls) > n/2 {
		t.Errorf("%d DeleteMessageBatch calls for %d single-message Acks, want them to share calls", len(calls), n)
	}
	if got := src.Stats().Deleted; got != n {
		t.Errorf("deleted %d, want %d", got, n)
	}
	if d := queueDepth(t, q.URL); d != 0 {
		t.Errorf("%d messages left in the queue, want none", d)
	}
}

// allowPolicyClient gives the queue queueURL the RedriveAllowPolicy policy,
// which ElasticMQ neither stores nor returns.
type allowPolicyClient struct {
	sqssource.Client
	queueURL, policy string
}

func (c allowPolicyClient) GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error) {
	out, err := c.Client.GetQueueAttributes(ctx, in, optFns...)
	if err == nil && aws.ToString(in.QueueUrl) == c.queueURL {
		out.Attributes[string(types.QueueAttributeNameRedriveAllowPolicy)] = c.policy
	}
	return out, err
}

// New refuses a dead-letter queue whose RedriveAllowPolicy does not allow
// the queue: its dead letters would be moved to another queue by a
// message-move task (sqsdlq.Broker.MoveAll) that trusts the policy.
func TestNewChecksRedriveAllowPolicy(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	ctx := testContext(t, 30*time.Second)
	q, other := newQueue(t, queueOptions{}), newQueue(t, queueOptions{})
	arn := func(url string) string {
		out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
		if err != nil {
			t.Fatal(err)
		}
		return out.Attributes[string(types.QueueAttributeNameQueueArn)]
	}
	byQueue := func(url string) string {
		return `{"redrivePermission":"byQueue","sourceQueueArns":["` + arn(url) + `"]}`
	}
	for _, tc := range []struct {
		policy string
		ok     bool
	}{
		{"", true},
		{`{"redrivePermission":"allowAll"}`, true},
		{byQueue(q.URL), true},
		{byQueue(other.URL), false},
		{`{"redrivePermission":"denyAll"}`, false},
	} {
		src, err := sqssource.New(ctx, allowPolicyClient{Client: c, queueURL: q.DLQURL, policy: tc.policy}, sqssource.Config{QueueURL: q.URL, DeadLetterQueueURL: q.DLQURL})
		if err == nil {
			_ = src.Close()
		}
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, idemq.ErrInvalidConfig)) {
			t.Errorf("RedriveAllowPolicy %s: New returned %v, want ok=%v or a configuration error", tc.policy, err, tc.ok)
		}
	}
}
