package sqssource_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/sqssource"
)

// gatedSends holds every SendMessage until release is closed, then fails it.
type gatedSends struct {
	sqssource.Client
	entered chan struct{}
	release chan struct{}
}

func (g *gatedSends) SendMessage(ctx context.Context, _ *sqs.SendMessageInput, _ ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.release:
	case <-ctx.Done():
	}
	return nil, errors.New("injected: dead-letter queue unavailable")
}

// TestFIFODeadLetterKeepsGroupUntilWritten checks that in strict FIFO order
// a message being dead-lettered keeps its group blocked until the dead letter
// is written, and that after a failed write it comes back before the later
// messages of its group.
func TestFIFODeadLetterKeepsGroupUntilWritten(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{FIFO: true})
	publish(t, q.URL, true,
		outMsg{Key: "a0", Body: "a", Group: "A"},
		outMsg{Key: "a1", Body: "a", Group: "A"})
	gate := &gatedSends{Client: sqsClient(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	cfg := sourceConfig(t, q)
	cfg.RedriveDelay = time.Second
	src, err := sqssource.New(testContext(t, 10*time.Second), gate, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })

	// Ask for 10 so that one ReceiveMessage call brings both messages: a1
	// then waits in the source's buffer for a0 to be settled.
	rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	got, err := src.Receive(rctx, 10)
	cancel()
	if err != nil || len(got) != 1 || got[0].Key != "a0" {
		t.Fatalf("first Receive returned %d messages (%v), want a0 alone", len(got), err)
	}
	first := got[0]
	dlErr := make(chan error, 1)
	go func() { dlErr <- src.DeadLetter(testContext(t, 20*time.Second), first, errors.New("poison")) }()
	select {
	case <-gate.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("DeadLetter did not send")
	}
	// While the dead letter is being written, group A stays blocked.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	msgs, err := src.Receive(ctx, 10)
	cancel()
	if err == nil {
		t.Fatalf("Receive handed out %s while %s was being dead-lettered", msgs[0].Key, first.Key)
	}
	close(gate.release)
	if err := <-dlErr; err == nil {
		t.Fatal("DeadLetter succeeded although the send failed")
	}

	var order []string
	for len(order) < 3 {
		m := receiveN(t, src, 1, 20*time.Second)[0]
		order = append(order, m.Key)
		if err := src.Ack(testContext(t, 10*time.Second), []*consumer.Message{m}); err != nil {
			t.Fatalf("Ack: %v", err)
		}
		if m.Key == "a1" {
			break
		}
	}
	if len(order) != 2 || order[0] != "a0" || order[1] != "a1" {
		t.Fatalf("after the failed dead letter, group A came in order %v, want [a0 a1]", order)
	}
}

// TestRedriveDelay checks that a message left to the redrive policy comes
// back after Config.RedriveDelay, not at once.
func TestRedriveDelay(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{MaxReceiveCount: 5})
	publish(t, q.URL, false, outMsg{Key: "p", Body: "poison"})
	cfg := sourceConfig(t, q)
	cfg.DeadLetterQueueURL = ""
	cfg.RedriveDelay = 3 * time.Second
	src := newSource(t, cfg)

	m := receiveN(t, src, 1, 20*time.Second)[0]
	start := time.Now()
	if err := src.DeadLetter(testContext(t, 10*time.Second), m, errors.New("poison")); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	again := receiveN(t, src, 1, 20*time.Second)[0]
	if waited := time.Since(start); waited < 2*time.Second {
		t.Fatalf("message came back after %s, want about RedriveDelay = %s", waited, cfg.RedriveDelay)
	}
	if again.ID != m.ID || again.Attempt != 2 {
		t.Fatalf("got %s attempt %d, want %s attempt 2", again.ID, again.Attempt, m.ID)
	}
}

// malformedDeletes answers every DeleteMessageBatch, without deleting, with
// a failure for an entry that was not sent.
type malformedDeletes struct{ sqssource.Client }

func (malformedDeletes) DeleteMessageBatch(context.Context, *sqs.DeleteMessageBatchInput, ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	return &sqs.DeleteMessageBatchOutput{Failed: []types.BatchResultErrorEntry{
		{Id: aws.String("bogus"), Code: aws.String("InternalError"), Message: aws.String("injected")},
	}}, nil
}

// TestMalformedDeleteResponse checks that Ack and DeadLetter report failure
// when DeleteMessageBatch answers for an entry that was not sent.
func TestMalformedDeleteResponse(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	publish(t, q.URL, false, numbered("bad", 3)...)
	cfg := sourceConfig(t, q)
	cfg.ReleaseTimeout = -1
	src, err := sqssource.New(testContext(t, 10*time.Second), malformedDeletes{sqsClient(t)}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	msgs := receiveN(t, src, 3, 20*time.Second)
	ctx := testContext(t, 20*time.Second)

	var be *sqssource.BatchError
	if err := src.Ack(ctx, msgs[:2]); !errors.As(err, &be) || len(be.Entries) != 2 {
		t.Fatalf("Ack returned %v, want a *BatchError with 2 entries", err)
	}
	if err := src.DeadLetter(ctx, msgs[2], errors.New("poison")); !errors.As(err, &be) {
		t.Fatalf("DeadLetter returned %v, want a *BatchError", err)
	}
	if n := queueDepth(t, q.URL); n != 3 {
		t.Fatalf("queue holds %d messages, want 3 (none deleted)", n)
	}
}

// TestAckSkipsForeignMessages checks that a foreign message in a batch is
// reported without keeping Ack from deleting the others.
func TestAckSkipsForeignMessages(t *testing.T) {
	t.Parallel()
	q := newQueue(t, queueOptions{})
	publish(t, q.URL, false, numbered("mixed", 2)...)
	src := newSource(t, sourceConfig(t, q))
	msgs := receiveN(t, src, 2, 20*time.Second)
	batch := []*consumer.Message{msgs[0], {ID: "foreign"}, msgs[1]}
	if err := src.Ack(testContext(t, 10*time.Second), batch); !errors.Is(err, sqssource.ErrForeignMessage) {
		t.Fatalf("Ack returned %v, want ErrForeignMessage", err)
	}
	if n := queueDepth(t, q.URL); n != 0 {
		t.Fatalf("queue holds %d messages, want 0", n)
	}
}
