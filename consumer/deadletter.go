package consumer

// Dead-letter metadata (Meta*): the names of the headers (Kafka, AMQP) or message
// attributes (SQS) that every source writes on a dead-lettered copy, so that
// a tool reading a dead-letter destination finds the same names whatever the
// broker. These are the only names of this metadata: a source adds its
// broker's own fields (kafkasource.MetaOriginTopic, amqpsource.MetaOriginQueue,
// sqssource.MetaOriginQueue, ...) under the same Meta prefix.
const (
	// MetaReason holds the dead-letter reason: the text of the error
	// passed to Source.DeadLetter.
	MetaReason = "idemq-reason"
	// MetaAttempts holds the number of attempts made, in decimal.
	MetaAttempts = "idemq-attempts"
	// MetaKey holds the deduplication key of the message, when it has
	// one.
	MetaKey = "idemq-key"
	// MetaDeadLetteredAt holds when the message was dead-lettered (RFC 3339).
	MetaDeadLetteredAt = "idemq-dead-lettered-at"
)
