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
// Receive long-polls ReceiveMessage, Ack deletes with DeleteMessageBatch
// and waits for SQS's answer, a heartbeat extends the visibility timeout of
// every message in flight, Retry changes the visibility timeout to the
// backoff delay, DeadLetter sends to Config.DeadLetterQueueURL or leaves the
// message to the queue's redrive policy, and Close releases what is still
// in flight; each method's documentation states its contract. docs/sources.md
// describes the source as a whole, including how it behaves on ElasticMQ,
// and docs/observability.md the telemetry attributes of its messages.
//
// # Deduplication keys
//
// The key the runner records is, in this order: the string message attribute
// named by Config.KeyAttribute (a business or idempotency key set by the
// producer), the consumer.MetaKey attribute (the key recorded for the
// original of a replayed dead letter), the MessageDeduplicationId on FIFO
// queues, else the MessageId (Message.ID, through consumer.DefaultKey). The
// receipt handle changes on every receive and is never a key. A producer
// that may send one logical message twice to a standard queue gets two
// MessageIds: give such messages a KeyAttribute, and set
// consumer.Config.KeyFunc to consumer.RequireKey to dead-letter those
// without.
//
// On FIFO queues Message.PartitionKey is the MessageGroupId; on standard
// queues it is the attribute named by Config.PartitionKeyAttribute, if any.
// Message.Headers holds the String and Number message attributes, and the
// AWSTraceHeader system attribute under the key "AWSTraceHeader" unless a
// message attribute has that name.
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
//     A message whose visibility keeps lapsing past that is no longer
//     recognised; keep retention above the queue's MessageRetentionPeriod.
//     Source.RedeliveryHorizon reports that period and the Runner refuses to
//     start when the store's retention is shorter (consumer.HorizonReporter).
//   - Dead letters sent to Config.DeadLetterQueueURL: a crash or failure
//     between the send and the delete of the original sends a second copy
//     when the original comes back (a FIFO dead-letter queue drops it within
//     its 5-minute deduplication interval).
//   - On the lease path, the window documented by consumer.Leased.
//
// # Attempts
//
// Message.Attempt is ApproximateReceiveCount: it counts receives, not handler
// failures, and the runner's retry policy counts handler failures whenever
// its store can (docs/sources.md). A redrive policy, however, counts every
// receive: with dead-lettering left to it, give maxReceiveCount ample room
// above RetryPolicy.MaxAttempts, or use Config.DeadLetterQueueURL.
//
// # Ordering on FIFO queues
//
// Order is kept per MessageGroupId, across failures too: Receive hands out a
// group's next message only after the previous one was settled, and a
// retried message, or one whose dead letter failed, takes the later messages
// of its group that were already received back to the queue with it.
// Distinct groups are handled in parallel. Config.RelaxedFIFOOrder trades
// this for throughput within a group.
package sqssource
