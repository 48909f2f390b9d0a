package amqpsource

import (
	"strconv"
	"time"
)

// retryDelays is the ladder of retry queue delays. A retry waits in the queue
// of the smallest delay that is at least the requested one, so it is never
// redelivered early and at most a fixed set of queues exists per source
// queue. Delays above the ladder are rounded up to whole hours.
var retryDelays = []time.Duration{
	100 * time.Millisecond,
	200 * time.Millisecond,
	500 * time.Millisecond,
	time.Second,
	2 * time.Second,
	5 * time.Second,
	10 * time.Second,
	20 * time.Second,
	30 * time.Second,
	time.Minute,
	2 * time.Minute,
	5 * time.Minute,
	10 * time.Minute,
	20 * time.Minute,
	30 * time.Minute,
	time.Hour,
}

// maxTTL is the largest x-message-ttl RabbitMQ accepts (2^32-1 ms, ~49 days).
const maxTTL = time.Duration(1<<32-1) * time.Millisecond

// retryBucket returns the delay of the retry queue for a requested delay.
func retryBucket(d time.Duration) time.Duration {
	for _, b := range retryDelays {
		if d <= b {
			return b
		}
	}
	h := (d + time.Hour - 1) / time.Hour * time.Hour
	return min(h, maxTTL/time.Hour*time.Hour)
}

// bucketName formats a bucket delay for a queue name: "100ms", "2s", "5m",
// "3h".
func bucketName(b time.Duration) string {
	switch {
	case b%time.Hour == 0:
		return strconv.FormatInt(int64(b/time.Hour), 10) + "h"
	case b%time.Minute == 0:
		return strconv.FormatInt(int64(b/time.Minute), 10) + "m"
	case b%time.Second == 0:
		return strconv.FormatInt(int64(b/time.Second), 10) + "s"
	}
	return strconv.FormatInt(b.Milliseconds(), 10) + "ms"
}

// RetryQueueNames returns the names of the retry queues a source whose
// RetryQueuePrefix is prefix may declare for delays up to an hour: one per
// step of the delay ladder. Retry queues do not expire (see RetryQueueArgs);
// delete these when a consumer is retired. A Retry of more than an hour waits
// in "<prefix><n>h", not listed.
func RetryQueueNames(prefix string) []string {
	names := make([]string, 0, len(retryDelays))
	for _, d := range retryDelays {
		names = append(names, prefix+bucketName(d))
	}
	return names
}
