package kafkasource

// Unexported limits the external tests check.
const (
	DeadLetterStuckAfter = deadLetterStuckAfter
	MaxReasonBytes       = maxReasonBytes
)
