package amqpsource

import "time"

// RetryQueueNames returns the names of every retry queue of the ladder under
// prefix, for test cleanups.
func RetryQueueNames(prefix string) []string {
	names := make([]string, 0, len(retryDelays))
	for _, d := range retryDelays {
		names = append(names, prefix+bucketName(d))
	}
	return names
}

// RetryQueueName returns the retry queue a Retry with delay d waits in.
func RetryQueueName(prefix string, d time.Duration) string {
	return prefix + bucketName(retryBucket(d))
}
