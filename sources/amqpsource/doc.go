// Package amqpsource is the RabbitMQ source of idemq (AMQP 0.9.1, through
// github.com/rabbitmq/amqp091-go): it consumes one queue with manual
// acknowledgements and implements consumer.Source.
//
//	src, err := amqpsource.New(ctx, amqpsource.Config{
//		URL:      "amqp://guest:guest@127.0.0.1:5672/",
//		Queue:    "orders",
//		Prefetch: amqpsource.PrefetchFor(runnerConfig),
//	})
//	...
//	defer src.Close()
//	r, err := consumer.NewRunner(src, consumer.Transactional(store, handler), runnerConfig)
//	...
//	err = r.Run(ctx)
//
// docs/sources.md (RabbitMQ) has the background: why the source reconnects
// by itself, the retry queues and their opt-out, a copy that fails, the
// broker's delivery limit.
//
// # Guarantees
//
//   - Ack after commit. A delivery is acknowledged only when the Runner
//     calls Ack, which it does after the transaction that recorded it has
//     committed. Ack records the acknowledgement and returns; a loop per
//     channel sends the settled run at the head of the channel as one
//     multiple-ack, which never covers a delivery that was not passed to
//     Ack (Config.AckHold: how long a delivery settled behind an unsettled
//     one waits for it). Close sends every recorded acknowledgement. A crash
//     or a dropped connection between Ack and the send redelivers those
//     deliveries, and the deduplication record absorbs them.
//   - Prefetch bounds the work in flight: Config.Prefetch is the channel's
//     QoS; PrefetchFor sizes it from the Runner's Concurrency and BatchSize.
//   - Nothing is lost on a dropped connection or on Close. The broker
//     requeues every unacknowledged delivery of a closed channel and
//     redelivers it with Redelivered set; the Source reconnects with backoff
//     (Config.ReconnectDelay, MaxReconnectDelay) and resumes consuming.
//     Delivery tags belong to one channel: each consumer.Delivery.Handle
//     remembers the channel session that issued its tag, settlements of a
//     dead session send nothing (ErrStaleDelivery), and deliveries of a dead
//     session still buffered in the client are dropped before Receive
//     returns them.
//   - Retry and DeadLetter acknowledge the original only after the broker
//     confirmed its copy. Retry's copy waits in a retry queue whose TTL is
//     the delay (rounded up, never early) and whose dead-letter route leads
//     back to the queue; retry queues are quorum queues with at-least-once
//     dead-lettering (RetryQueueDefaults), so a broker restart while copies
//     expire loses none. New refuses a broker that cannot do this (RabbitMQ
//     before 3.10, or not RabbitMQ) unless Config.ClassicRetryQueues opts
//     out. DeadLetter's copy carries its reason, MetaOriginQueue and the
//     consumer.Meta* headers. A copy that fails leaves the original
//     unacknowledged, handed back to its queue after a hold of at most
//     Config.UnroutableDelay; a dead letter whose destination does not exist
//     is parked in a retry queue: never dropped, never a hot loop.
//   - Deduplication key: the Config.KeyHeader header, else the message-id
//     property. A message with neither has an empty Key and ID, so the
//     runner dead-letters it with consumer.ErrMissingKey, unless
//     Config.BodyHashKey opts into the body's SHA-256 as the key.
//   - Attempt counts every delivery the Source can know of: 1 + the retry
//     trips (HeaderRetries) + the broker's x-delivery-count (quorum queues).
//     The runner's RetryPolicy.MaxAttempts counts handler failures instead
//     when its store can (dedupdriver.Caps.FailureCount), so a crash loop
//     does not dead-letter a message.
//   - The broker's delivery limit does not dead-letter before idemq would:
//     handler failures never count toward a quorum queue's x-delivery-limit,
//     which Config.Declare sets to Topology.DeliveryLimit (100) with the
//     same dead-letter route as DeadLetter's copies (DeadLetterReason reads
//     the broker's reason).
//
// # Remaining duplicate window
//
// The source delivers at least once; duplicates reach the Runner, which
// absorbs them, and the handler's effect still happens once on the
// transactional path. Deliveries are repeated when: the process stops or the
// connection drops after the commit and before the ack reaches the broker
// (acks are not confirmed by AMQP 0.9.1); a channel dies between a retry or
// dead-letter copy's confirm and the original's ack (both come back); a
// copy's confirm times out although the broker wrote it, and the original is
// handed back as well; a producer publishes the same key twice. A redelivery
// later than the dedup store's retention is no longer recognised.
//
// # Order and telemetry
//
// RabbitMQ delivers a queue in order to one consumer, but retries,
// redeliveries and competing consumers reorder messages; see
// Config.PartitionKeyHeader. Message.Broker carries the OpenTelemetry
// messaging attributes listed in docs/observability.md.
package amqpsource
