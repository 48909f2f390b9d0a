package consumer

// Log attribute keys used by the runner.
const (
	LogKeyConsumer = "consumer"
	LogKeyKey      = "key"
	LogKeyID       = "message_id"
	LogKeyTopic    = "topic"
	LogKeyAttempt  = "attempt"
	LogKeyError    = "err"
	LogKeyDelay    = "delay"
	LogKeyCount    = "count"
	LogKeyStored   = "stored_hash"
	LogKeyReceived = "received_hash"
	// LogKeySettleError is the error of a failed Retry or DeadLetter call,
	// logged beside the message's own error (LogKeyError).
	LogKeySettleError = "settle_err"
)
