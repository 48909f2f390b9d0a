// Package memsource is an in-memory message broker with at-least-once
// delivery and scripted faults, for unit tests, the user test kit and demos.
// It is never a replacement for the real broker in an adapter's tests.
//
//	b := memsource.New(memsource.Config{VisibilityTimeout: time.Second})
//	b.Publish("orders", memsource.Outgoing{Key: "order-1", Body: body})
//	src := b.Source("orders") // a consumer.Source
//	runner, err := consumer.NewRunner(src, path, consumer.Config{Name: "billing"})
//
// # Delivery semantics
//
// A topic is created on first use. Sources opened on one topic compete for
// its messages (a consumer group). A received message is in flight until it
// is settled:
//
//   - Ack removes it for good.
//   - Retry(msg, d) makes it deliverable again d from now.
//   - DeadLetter moves it, with the reason and the attempt, to the topic's
//     dead-letter list, read with Broker.DeadLetters.
//   - Unsettled, it becomes deliverable again when its visibility timeout
//     passes (Config.VisibilityTimeout, or WithVisibilityTimeout), at once
//     when its Source closes, and at once when the broker restarts
//     (Broker.Restart).
//
// Every redelivery keeps Message.ID and Message.Key and has Attempt increased
// and Redelivered set; Attempt counts every delivery of the message. Settling
// a delivery that no longer counts (expired, returned by Close or Restart)
// fails with ErrDeliveryExpired and changes nothing; settling a message that
// is already acknowledged or dead-lettered is a no-op.
//
// # Order
//
// Messages are delivered in publish order, except that a message retried
// with a delay, or returned, goes out when it is deliverable again. Messages
// with the same non-empty PartitionKey are delivered in publish order: a
// message is delivered to a Source only when every earlier message of its
// partition key has been settled or is in flight to that same Source, so
// competing sources never hold one partition key at once (like SQS FIFO
// message groups). Duplicate faults deliberately break this order.
//
// # Faults
//
// Broker.Inject scripts failures per topic, per message (Key or ID) and by
// probability, drawn from an RNG seeded with Config.Seed. Its kinds
// (FaultKind) are the one vocabulary every in-memory kit speaks, under the
// same names: a second delivery (Redelivered), the same message to two
// sources at once (ConcurrentDuplicate), an acknowledgement lost after the
// commit (CrashAfterCommit), failing Ack, Retry and DeadLetter (AckError,
// RetryError, DeadLetterError), and receive errors (ReceiveError).
// SetUnavailable makes the whole broker unreachable for a while.
//
// # Observation
//
// Broker.Stats counts deliveries, redeliveries, acknowledgements, retries,
// dead letters and expiries per topic and reports what is ready, in flight
// and pending. Config.OnEvent receives every step, numbered, before the call
// that caused it returns, so a test can merge the broker's acknowledgements
// with a store's commits and check their order.
//
// # Duplicate window
//
// memsource delivers at least once, like every real broker: each fault above
// makes a message arrive again. A Runner with a deduplication store absorbs
// those duplicates; memsource adds no window of its own, and loses nothing:
// a message leaves a topic only through Ack or DeadLetter.
//
// A Broker and its Sources are safe for concurrent use. Nothing is persisted.
package memsource
