package consumer

// Log attribute keys used by the runner.
const (
	LogKeyConsumer = "consumer"
	LogKeyKey      = "key"
	LogKeyID       = "message_id"
	// LogKeyQueue is the queue, topic or route a message came from
	// (Message.Topic), or that a source consumes.
	LogKeyQueue    = "queue"
	LogKeyAttempt  = "attempt"
	LogKeyError    = "err"
	LogKeyDelay    = "delay"
	LogKeyCount    = "count"
	LogKeyStored   = "stored_hash"
	LogKeyReceived = "received_hash"
	// LogKeySettleError is the error of a failed Retry or DeadLetter call,
	// logged beside the message's own error (LogKeyError).
	LogKeySettleError = "settle_err"
	// LogKeyStack is the stack of a handler or KeyFunc that panicked
	// (PanicError.Stack), on the line that retries or dead-letters its
	// message.
	LogKeyStack = "stack"
	// LogKeyDrainTimeout is Config.DrainTimeout, on the line that starts
	// the drain when Run's context is done.
	LogKeyDrainTimeout = "drain_timeout"
	// LogKeyElapsed is how long something took: the drain, on the line
	// "stopped".
	LogKeyElapsed = "elapsed"
	// LogKeyHorizon and LogKeyRetention are the source's redelivery horizon
	// and the store's retention, on the lines of the retention check.
	LogKeyHorizon   = "redelivery_horizon"
	LogKeyRetention = "dedup_retention"
	// LogKeyStoreLoss says how the store's server can lose the records it
	// acknowledged (dedup.Durability.Loss).
	LogKeyStoreLoss = "store_loss"
	// LogKeyStoreSettings are the persistence settings the store read
	// (dedup.Durability.Settings).
	LogKeyStoreSettings = "store_settings"
)
