package consumer

// Header names of a request that asks for a reply, on brokers whose
// messages have no reply properties of their own (Kafka headers, SQS
// message attributes). kafkasource and sqssource read them into
// Message.ReplyTo and Message.CorrelationID; amqpsource reads the AMQP
// reply_to and correlation_id properties instead. sinks/outbox's Reply
// writes HeaderCorrelationID on the reply (and, on RabbitMQ, its
// correlation_id property).
const (
	// HeaderReplyTo names where the reply goes: a Kafka topic, or an SQS
	// queue URL or name.
	HeaderReplyTo = "idemq-reply-to"
	// HeaderCorrelationID is the id the requester matches its reply by.
	HeaderCorrelationID = "idemq-correlation-id"
)
