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
// # Guarantees
//
//   - Ack after commit. A delivery is acknowledged only when the Runner
//     calls Ack, which it does after the transaction that recorded it has
//     committed. Ack records the acknowledgement and returns; a background
//     loop per channel sends it, so no worker waits for a socket write and
//     the acknowledgements of concurrent Ack calls share frames: the oldest
//     unacknowledged deliveries of the channel that are all settled go out
//     as one multiple-ack (Stats.Acked, Stats.AckFrames). A multiple-ack
//     never covers a delivery that was not passed to Ack. Concurrent lanes
//     settle interleaved delivery tags, so a delivery settled behind one
//     still being handled waits for it, up to Config.AckHold (20 ms), and
//     the multiple-ack that follows covers both; past the hold, or while
//     more than half of the prefetch would wait, the waiting deliveries are
//     acknowledged one frame each, so a slow delivery ahead never keeps more
//     than half of the prefetch slots. RabbitMQ's queue handles
//     acknowledgements frame by frame, and fewer frames leave it more time
//     to deliver (docs/performance.md has the measurements, from
//     cmd/internal/bench/amqp). Close sends every recorded acknowledgement
//     before it closes the connection; Retry and DeadLetter, whose copy is
//     out, acknowledge the original without a hold (and end the hold of the
//     others). This widens the redelivery window by the hold: if the
//     process crashes or the connection drops between Ack and the send,
//     the broker redelivers those deliveries, and the deduplication record
//     absorbs them: the Runner acknowledges them without running the
//     handler.
//   - Prefetch bounds the work in flight: Config.Prefetch is the channel's
//     QoS; PrefetchFor sizes it from the Runner's Concurrency and BatchSize.
//   - Nothing is lost on a dropped connection. When the connection or the
//     channel dies, the broker requeues every unacknowledged delivery and
//     redelivers it with Redelivered set; the deduplication record makes the
//     redelivery a no-op if its effect had committed. The Source reconnects
//     with exponential backoff (Config.ReconnectDelay, MaxReconnectDelay,
//     500 ms by default, so it is back within about that once the broker
//     answers again) and resumes consuming. Delivery tags belong to one channel: each
//     consumer.Delivery.Handle remembers the channel session that issued its tag, and
//     settlements of a dead session send nothing (ErrStaleDelivery) instead of
//     acknowledging an unrelated delivery that reuses the number on the new
//     channel. Deliveries of a dead session still buffered in the client are
//     dropped before Receive returns them.
//   - Nothing is lost on Close: deliveries received or buffered but not
//     acknowledged return to the queue when the connection closes.
//   - Delayed retry without losing the message. Retry publishes a copy to a
//     durable retry queue whose message TTL is the delay (rounded up to a
//     fixed ladder, 100 ms to 1 h, then whole hours, so never early) and
//     whose dead-letter route leads back to the queue; the original is
//     acknowledged only after the broker confirmed the copy. The copy carries
//     HeaderRetries, from which Message.Attempt is computed. Retry queues are
//     quorum queues with at-least-once dead-lettering by default (see
//     RetryQueueDefaults and "Retry queues" below): a broker restart while
//     copies expire loses none of them. New refuses a broker that cannot do
//     this (RabbitMQ before 3.10, or not RabbitMQ) with a *idemq.ConfigError on
//     Config.ClassicRetryQueues, the explicit opt-out.
//   - A copy that fails does not pin its delivery. If a retry or dead-letter
//     copy cannot be published (a refused retry queue declaration, a negative
//     confirm, no confirm within Config.PublishTimeout under a memory or disk
//     alarm, a publishing channel the broker closes), the original is not
//     acknowledged; it is handed back to its queue (basic.reject with requeue)
//     after a hold: the retry delay, or a backoff from 1 s that doubles while
//     copies keep failing, whichever is longer, but at most
//     Config.UnroutableDelay. Left unacknowledged on a live channel it would
//     keep a prefetch slot until the broker's consumer_timeout, and Prefetch
//     such deliveries would stop consumption; the hold keeps a copy that
//     always fails from looping hot. On a classic queue the requeued message
//     keeps its place at the head and its Attempt, so while its copies keep
//     failing (a misconfigured retry queue) it keeps cycling, and with
//     Prefetch 1 the messages behind it wait until the cause is fixed; on a
//     quorum queue each requeue raises Attempt, so the Runner's MaxAttempts
//     and the queue's delivery limit end the cycle.
//   - Dead letters carry their reason. DeadLetter publishes a copy to
//     Config.DeadLetterExchange / DeadLetterRoutingKey (default: the queue
//     "<queue>.dlq" through the default exchange) with consumer.MetaReason,
//     consumer.MetaAttempts, MetaOriginQueue, consumer.MetaKey and consumer.MetaDeadLetteredAt, and
//     acknowledges the original only after the broker confirmed the copy. If
//     the destination does not exist the broker returns the copy (it is
//     published with the mandatory flag), or closes the publishing channel
//     when the exchange is missing, and the message is parked in a retry
//     queue for Config.UnroutableDelay: never dropped, never a hot loop.
//   - Deduplication key: the Config.KeyHeader header (default
//     "idempotency-key"), else the message-id property. A message with
//     neither has an empty Key and ID, so the runner dead-letters it with
//     consumer.ErrMissingKey (consumer.RequireKey, as
//     consumer.Config.KeyFunc, says so in the reason), unless
//     Config.BodyHashKey opts into the body's SHA-256 as the key, which is
//     weaker (identical bodies are one message; a resend with a changed body
//     is not recognised).
//   - Attempt counts every delivery the Source can know of: 1 + the retry
//     trips (HeaderRetries) + the broker's x-delivery-count (quorum queues,
//     which count deliveries returned unsettled, such as those of a consumer
//     that crashed or was killed). The runner's RetryPolicy.MaxAttempts
//     counts handler failures instead when its store counts them
//     (dedupdriver.Caps.FailureCount: pgdedup, sqldedup and redisdedup do), so a crash
//     loop does not dead-letter a message (TestCrashLoopIsNotCounted);
//     Attempt decides only when the count cannot be written or the store
//     cannot count.
//   - The broker's delivery limit does not dead-letter before idemq would.
//     A handler failure is retried as a new copy whose x-delivery-count
//     starts at 0, so a quorum queue's x-delivery-limit counts only
//     unsettled returns: crashes, restarts and dropped connections while a
//     message was held. Config.Declare sets it to DefaultDeliveryLimit (100),
//     far above the Runner's MaxAttempts, and sets the queue's dead-letter
//     route to the same destination as DeadLetter's copies, with
//     at-least-once dead-lettering: a message that crash-loops its consumers
//     100 times lands in the dead-letter queue by the broker's hand, with
//     x-first-death-reason "delivery_limit" (DeadLetterReason reads either
//     kind of reason) instead of the Header* headers. A queue declared by
//     operations should get the same arguments: since RabbitMQ 4.0 a quorum
//     queue without x-delivery-limit has a limit of 20, and without a
//     dead-letter route the broker drops the message at the limit.
//
// # Reconnecting: why not the client's own recovery
//
// amqp091-go v1.16 offers automatic connection recovery (amqp091.Config
// Recovery). The Source does not use it, and New rejects a configuration that
// enables it. Recovery reopens channels under the same *amqp091.Channel value,
// where delivery tags start again at 1: a tag held from before the drop would
// then acknowledge a different, unprocessed delivery, losing it. The Source
// would have to learn of every recovery before any ack races it, and the
// notifications are asynchronous; its recovery also logs through a
// package-global logger and is marked experimental. A small reconnect loop
// that builds a new connection and channel, and lets the old ones die with
// their tags, makes that mistake impossible by construction.
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
// # Retry queues
//
// A retry queue is a quorum queue ("x-queue-type": "quorum") with
// "x-dead-letter-strategy": "at-least-once" and "x-overflow":
// "reject-publish" (RetryQueueDefaults; Config.RetryQueueArgs adds
// arguments but cannot weaken these). It keeps each expired copy until the
// source queue has confirmed it, so a broker restart at that moment, a full
// source queue or a missing one delays the copy instead of dropping it. This
// needs RabbitMQ 3.10 or later; New checks the server's version and fails
// with a *idemq.ConfigError (errors.Is idemq.ErrInvalidConfig) on an older or
// another broker. The cost: a quorum queue per retry delay used (at most 16
// plus one per hour of longer delays), each with its own Raft log on disk,
// and more time per retry copy (BenchmarkRetry measures it against classic
// retry queues; docs/performance.md has the numbers). Retries are the
// exception, so this rarely shows in throughput.
//
// A delayed copy can come back late after a broker restart: when a retry
// queue's dead-letter worker starts before the default exchange is back
// (RabbitMQ logs "Cannot forward any dead-letter messages ... does not
// exist"), it resends the copies that expired meanwhile only after RabbitMQ's
// dead_letter_worker_publisher_confirm_timeout, 3 minutes by default (an
// advanced.config setting). They are not lost:
// TestDefaultConfigSurvivesBrokerRestart took 190 s instead of about 25 s
// when it happened. The test broker of this repository sets 10 s; a copy
// resent early is a duplicate the deduplication record absorbs.
//
// A retry queue does not expire: an at-least-once retry queue keeps an
// expired copy until the source queue has confirmed it, as long as that
// takes (a broker restart, the source queue's leader not elected yet), and
// RabbitMQ deletes a queue with "x-expires" with whatever it holds, so New
// refuses "x-expires" in Config.RetryQueueArgs. Delete the retry queues
// (RetryQueueNames; QueueNames lists them with the queue and its dead-letter
// queue) when a consumer is retired. With ClassicRetryQueues,
// "x-expires" is allowed; as RabbitMQ counts it from the last declaration
// (publishing does not count, and a retry queue has no consumer), the
// source then declares a retry queue again before a copy goes in once
// (x-expires - delay) / 2 has passed since it last did, so that every copy
// leaves before the queue can expire, and refuses a retry whose delay is not
// shorter than x-expires (the message is handed back, as after a failed
// copy, and Retry returns an error wrapping a *idemq.ConfigError).
//
// A retry queue's arguments cannot change while it exists. A classic retry
// queue left by an older configuration makes its retries fail (the broker
// refuses the declaration with PRECONDITION_FAILED, the error says so, and
// the originals are handed back to the source queue, see above) until it is
// deleted, once it is empty.
//
// Config.ClassicRetryQueues opts out, for brokers without quorum queues or
// where the loss is acceptable. A classic queue dead-letters an expired
// message at most once: it republishes the message to the source queue
// without a confirm and forgets it, whether or not the source queue took it.
// The retried message, whose original was acknowledged when the copy was
// confirmed, is then gone, without an error anywhere, when:
//   - the broker crashes or restarts at the moment the copy expires, or
//     the copy expires while the broker is down (measured with
//     TestDefaultConfigSurvivesBrokerRestart on RabbitMQ 3.10: with
//     classic retry queues one restart lost 1,114 of 3,000 retried
//     messages, those whose copies waited 5 s or 10 s; with the default
//     quorum retry queues none);
//   - the source queue refuses it: a full queue with x-max-length or
//     x-max-length-bytes and x-overflow "reject-publish" drops the
//     dead-lettered copy;
//   - the source queue does not exist any more (deleted, or an auto-delete
//     queue removed): the copy routes nowhere.
//
// # Order
//
// RabbitMQ delivers a queue in order to one consumer, but retries,
// redeliveries and competing consumers reorder messages. Message.PartitionKey
// is the Config.PartitionKeyHeader header, when configured: the Runner then
// handles messages of one partition key in one lane, which keeps batches
// that update the same rows from deadlocking each other.
//
// # Telemetry
//
// Message.Broker says, in the terms of the OpenTelemetry messaging
// conventions, where a message came from: messaging.system "rabbitmq",
// Config.URL's host and port as server.address and server.port, the
// destination's messaging.destination.name "{exchange}:{routing
// key}:{queue}" (leaving out the default exchange, and the routing key when
// it is the queue's name) and messaging.rabbitmq.destination.routing_key,
// and the delivery's messaging.rabbitmq.message.delivery_tag.
package amqpsource
