package brokerenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/internal/testenv"
)

// DeleteSQSQueuesAtCleanup deletes the queues named queues from the
// SQS-compatible server at endpoint when t and its subtests end, as
// DeleteQueuesAtCleanup does on RabbitMQ. A queue that does not exist is
// fine; another failure is logged, not fatal.
func DeleteSQSQueuesAtCleanup(t testing.TB, endpoint string, queues ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		client := sqs.New(sqs.Options{
			Region:       testenv.SQSRegion,
			BaseEndpoint: aws.String(endpoint),
			Credentials:  credentials.NewStaticCredentialsProvider(testenv.SQSAccessKeyID, testenv.SQSSecretAccessKey, ""),
		})
		for _, q := range queues {
			out, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(q)})
			var missing *types.QueueDoesNotExist
			if errors.As(err, &missing) {
				continue
			}
			if err == nil {
				_, err = client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
			}
			if err != nil {
				t.Logf("delete SQS queue %s: %v", q, err)
			}
		}
	})
}
