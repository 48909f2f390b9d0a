package dedup

import "time"

// RetentionReporter is implemented by stores that forget a record after a
// fixed retention. The Runner compares it with its source's redelivery
// horizon (consumer.HorizonReporter) when Run starts: a redelivery later
// than the retention is not recognised and runs the handler again.
type RetentionReporter interface {
	// Retention returns how long a processed record is kept.
	Retention() time.Duration
}
