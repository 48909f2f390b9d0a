package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sqssource"
)

// The worker credits every distinct payment once, although a tenth of them
// were published twice, and dead-letters a payment to an unknown account.
func TestWorkerCreditsEachPaymentOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ElasticMQ and PostgreSQL; skipped with -short")
	}
	endpoint, dbURL := testenv.SQSEndpoint(t), testenv.DatabaseURL(t)
	schema := testenv.Schema(t, dbURL)
	queue := "idemq-example-test-" + strings.ToLower(rand.Text()[:10])

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := sqssource.NewClient(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	queueURL, dlqURL, err := createQueues(ctx, client, queue)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, u := range []string{queueURL, dlqURL} {
			_, _ = client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(u)})
		}
	})
	// One payment to an account that does not exist.
	if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl: aws.String(queueURL), MessageBody: aws.String(`{"account":9999,"amount":1}`),
	}); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	o := options{
		endpoint: endpoint, databaseURL: dbURL, queue: queue, schema: schema,
		accounts: 10, publish: 200, idle: time.Second, concurrency: 2, batch: 10,
		log: slog.New(slog.DiscardHandler),
		// A ReceiveMessage response can be lost after SQS hid its
		// messages (the SDK then retries the call); they come back after
		// the 30 s visibility timeout. Idle time counts only once every
		// payment was settled, so the test waits for them.
		settled: func(s consumer.Stats) bool { return s.Handled+s.Duplicates+s.DeadLettered >= 221 },
	}
	if err := run(ctx, o, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	var want int64
	for n := range o.publish {
		want += int64(100 + n%7)
	}
	for _, line := range []string{
		"handled 200, duplicates 20, retried 0, dead-lettered 1,",
		fmt.Sprintf("credited in total: %d cents", want),
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("output lacks %q:\n%s", line, out.String())
		}
	}

	dead, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl: aws.String(dlqURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 5, MessageAttributeNames: []string{"All"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead.Messages) != 1 || !strings.Contains(aws.ToString(dead.Messages[0].MessageAttributes[consumer.MetaReason].StringValue), "unknown account 9999") {
		t.Fatalf("dead letters %+v, want the payment to account 9999 with its reason", dead.Messages)
	}
}
