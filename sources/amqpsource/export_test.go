package amqpsource

import "time"

// RetryQueueName returns the retry queue a Retry with delay d waits in.
func RetryQueueName(prefix string, d time.Duration) string {
	return prefix + bucketName(retryBucket(d))
}
