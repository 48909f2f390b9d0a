// Package sqssource is the Amazon SQS source of idemq
// (github.com/aws/aws-sdk-go-v2/service/sqs). Plug a *Source into a
// consumer.Runner and every message's effect happens once, although SQS
// delivers at least once:
//
//	client, err := sqssource.NewClient(ctx, "") // default AWS configuration chain; see NewClient for emulators
//	src, err := sqssource.New(ctx, client, sqssource.Config{
//		QueueURL:           "https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
//		DeadLetterQueueURL: "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq",
//	})
//	defer src.Close()
//	runner, err := consumer.NewRunner(src, consumer.Transactional(store, handle), consumer.Config{Name: "billing"})
//	err = runner.Run(ctx)
//
// # What it does
//
//   - Receive long-polls ReceiveMessage (up to 10 messages a call, up to
//     Config.MaxReceivers calls in parallel when the runner asks for more,
//     the next calls started while the runner handles the last messages)
//     and requests ApproximateReceiveCount, MessageGroupId and
//     MessageDeduplicationId.
//   - Ack deletes with DeleteMessageBatch. The runner calls it only after
//     the transaction that recorded the messages committed; entries that fail
//     are sent again when that can help, and nothing else is ever deleted.
//     The deletes of one Ack go out in batches of 10, in parallel, and Ack
//     waits for them: unlike the Kafka and RabbitMQ sources, which defer
//     their offset commits and acks, this source does not widen the
//     redelivery window. A crash between the commit and the delete (one
//     DeleteMessageBatch call) brings the message back after its visibility
//     timeout, and the deduplication record absorbs it: it is deleted
//     without running the handler.
//   - A heartbeat extends the visibility timeout of every message that is in
//     flight (received and not yet settled) with ChangeMessageVisibilityBatch,
//     up to Config.MaxExtension, so that no other worker receives a message
//     while it waits for its turn or its handler runs (see
//     Config.HeartbeatInterval).
//   - Retry changes the visibility timeout to the backoff delay. The next
//     receive raises ApproximateReceiveCount, which is Message.Attempt (the
//     broker's count; see Attempts for what the runner counts).
//   - DeadLetter sends the message to Config.DeadLetterQueueURL with the
//     reason as message attributes (consumer.MetaReason, consumer.MetaAttempts, ...) and then
//     deletes it; or, without that URL, leaves it to the queue's redrive
//     policy (see Source.DeadLetter for both).
//   - Close releases the messages still in flight (visibility 0), so other
//     workers get them at once. It cancels the ReceiveMessage calls still
//     in flight: messages SQS had already hidden for one of them come back
//     only after their VisibilityTimeout.
//
// # Deduplication keys
//
// The key the runner records is, in this order: the string message attribute
// named by Config.KeyAttribute (a business or idempotency key set by the
// producer), the consumer.MetaKey attribute (the key recorded for the
// original of a replayed dead letter), the MessageDeduplicationId on FIFO
// queues, else the MessageId (Message.ID, through consumer.DefaultKey). The MessageId is stable across
// redeliveries; the receipt handle changes on every receive and is never a
// key. A producer that may send one logical message twice to a standard queue
// gets two MessageIds: give such messages a KeyAttribute, and set
// consumer.Config.KeyFunc to consumer.RequireKey to dead-letter those without.
//
// On FIFO queues Message.PartitionKey is the MessageGroupId; on standard
// queues it is the attribute named by Config.PartitionKeyAttribute, if any,
// which serializes the messages of one entity (one lane of the runner) so
// that concurrent transactions do not deadlock on its rows.
//
// Message.Headers holds the String and Number message attributes, and the
// AWSTraceHeader system attribute (an X-Ray trace header, set by AWS
// services or by SendMessage's MessageSystemAttributes) under the key
// "AWSTraceHeader" unless a message attribute has that name, so that
// consumer/otelidemq can parent its spans on the producer's trace.
//
// # Guarantees
//
// With the runner's transactional path, every message's effect is applied
// once: a redelivery (after a crash between commit and delete, a failed
// delete, an expired visibility timeout, or SQS's own at-least-once delivery)
// finds its key recorded and is deleted without running the handler, and two
// deliveries handled at the same moment by two workers serialize on the
// record's row lock. The heartbeat only avoids that wasted work; the
// guarantee does not depend on it. Nothing is deleted before its transaction
// committed, and a message that is never settled comes back after its
// visibility timeout.
//
// # Remaining duplicate window
//
// The transactional path has none for the handler's effects. What remains:
//
//   - Keys are remembered for the dedup store's retention (8 days by default).
//     A message whose visibility keeps lapsing past that (for example one
//     retried for days) is no longer recognised; keep retention above the
//     queue's MessageRetentionPeriod (4 days by default, up to 14 days) to
//     close this. Source.RedeliveryHorizon reports that period and the
//     Runner refuses to start when the store's retention is shorter (see
//     consumer.HorizonReporter).
//   - Dead letters sent to Config.DeadLetterQueueURL: a crash or failure
//     between the send and the delete of the original sends a second copy
//     when the original comes back (a FIFO dead-letter queue drops it within
//     its 5-minute deduplication interval).
//   - On the lease path, the window documented by consumer.Leased.
//
// # Attempts
//
// Message.Attempt is ApproximateReceiveCount: it counts receives, not handler
// failures. A message released by Close, received again after its
// visibility lapsed (a worker that crashed or was killed, heartbeat
// disabled, or past MaxExtension), or retried by the runner because of a
// database failure or a duplicate of its key in the same batch counts one
// more receive. The runner does not use it for its retry policy when its
// store counts handler failures (dedupdriver.Caps.FailureCount: pgdedup, sqldedup and
// redisdedup do): RetryPolicy.MaxAttempts then means handler failures, and a
// crash loop does not dead-letter a message (TestCrashLoopIsNotCounted kills
// a worker ten times with the message in flight). Only when the count cannot
// be written, or the store cannot count, does ApproximateReceiveCount decide.
//
// A redrive policy, however, counts every receive: with dead-lettering left
// to the redrive policy, a long database outage or a crash loop can move
// messages to the dead-letter queue, so give maxReceiveCount ample room above
// RetryPolicy.MaxAttempts, or use Config.DeadLetterQueueURL. Until the
// redrive policy moves it, a poison message handed to it comes back after
// Config.RedriveDelay (30 s by default) and is handled again: with a store
// that counts handler failures, the runner forgets the count when it hands a
// message over (so that a replayed dead letter starts afresh), so each
// hand-over is followed by up to MaxAttempts handler runs with the retry
// backoff; without one, by a single run. Every one of those receives counts
// toward maxReceiveCount, which bounds the total.
//
// # Ordering on FIFO queues
//
// Order is kept per MessageGroupId, across failures too: Receive hands out a
// group's next message only after the previous one was settled, and when a
// message is retried, the later messages of its group that SQS had already
// delivered are made visible again, so SQS delivers them after it. A message
// being dead-lettered blocks its group until the dead letter is written and
// the original deleted; if either fails, it goes back like a retry. Distinct
// groups are handled in parallel. Config.RelaxedFIFOOrder trades this for
// throughput within a group.
//
// # ElasticMQ and other emulators
//
// The package is tested against ElasticMQ 1.7 through the AWS JSON protocol:
// ReceiveMessage with long polling, DeleteMessageBatch,
// ChangeMessageVisibility(Batch), FIFO queues with MessageGroupId and
// MessageDeduplicationId, redrive policies and ApproximateReceiveCount behave
// as on SQS. Differences seen: ElasticMQ renders a redrive policy's
// maxReceiveCount as a JSON number where SQS documents a string (both are
// accepted), and it refuses a receipt handle with ReceiptHandleIsInvalid once
// the message was received again, where SQS may answer success without
// deleting (its documentation asks for the latest handle). Either way the
// message comes back and is deleted as a duplicate. The shared ElasticMQ keeps
// its queues in memory; the restart test (TestDefaultConfigSurvivesBrokerRestart)
// runs an ElasticMQ of its own that keeps queues and messages in a database
// file, restarts it in the middle of a run with the default configuration,
// and finds every message handled once.
//
// # Telemetry
//
// Message.Broker says, in the terms of the OpenTelemetry messaging
// conventions, where a message came from: messaging.system "aws_sqs", the
// queue URL's host and port (the scheme's default port when it names none)
// as server.address and server.port, the destination's aws.sqs.queue.url,
// and "delete" as the name of an acknowledgement.
package sqssource
