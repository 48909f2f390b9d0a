// Package kafkasource is the consumer.Source for Apache Kafka, built on
// segmentio/kafka-go's consumer-group Reader.
//
//	src, err := kafkasource.New(ctx, kafkasource.Config{
//		Brokers: []string{"127.0.0.1:9092"},
//		Topics:  []string{"orders"},
//		GroupID: "billing",
//	})
//	...
//	runner, err := consumer.NewRunner(src, consumer.Transactional(store, handle), consumer.Config{Name: "billing"})
//
// # Reading and committing
//
// Messages are fetched with Reader.FetchMessage (never ReadMessage, which
// commits before the message is processed). Offsets are requested for
// commit only from Ack and DeadLetter, that is after the message's effect (or
// its dead-letter copy) is durable, and only requested: Ack does not wait for
// the broker. The reader's commit loop (kafka-go's CommitInterval mode) merges
// the requests and commits the highest requested offset of each partition
// once per Config.CommitInterval (default 1 s), again when the group
// rebalances (kafka-go commits before the generation ends, so the next owner
// of a partition starts after everything this member settled), and on Close.
// A failed commit is retried at the next tick and counted in
// Stats.CommitFailures. So one commit request per interval reaches the broker
// instead of one per Ack, and no broker round trip is on the worker's path.
//
// The price is a wider redelivery window: a crash (not a Close and not a
// rebalance, which both commit) loses at most the last CommitInterval of
// commits, and those messages are delivered again. Their effects and records
// are already committed, so the deduplication record absorbs them: the
// runner acknowledges them without running the handler.
//
// Committing offset N commits every earlier offset of the partition, while the
// runner handles a partition's messages concurrently (messages of different
// keys run in different lanes). So the source keeps, for every partition, the
// fetched messages in fetch order and commits only the offset after the
// longest prefix of them that is settled (acknowledged or dead-lettered). A
// message settled behind an unsettled one is committed later, by the commit
// that passes it. The offset this source commits for a partition is therefore
// always truthful: every message below it was settled by this source, or lies
// below the offset the partition's reader started from, which was itself
// committed truthfully.
//
// # Order
//
// Message.PartitionKey is the Kafka message key (Config.Ordering =
// OrderByKey), so the runner handles the messages of one key in offset order;
// messages without a key are not ordered. OrderByPartition orders whole
// partitions instead. When a message is retried, the later messages of its
// key in its partition that were fetched after the failure wait in the
// source until it is settled (acknowledged or dead-lettered), and are then
// handed out in order. Messages of that key that the runner had already
// received when the failure happened are not held back; when several of them
// are retried too, the ones due at the same time are handed out again in
// offset order. Held messages do not count against Config.MaxInFlight, so a
// retried key (with OrderByPartition, a retried partition) does not stop the
// fetching of other partitions until Config.MaxUncommitted messages are
// retained.
//
// # Retries and dead letters
//
// Kafka has no negative acknowledgement. Retry redelivers the message in
// process after the delay with Attempt increased; its offset stays
// uncommitted meanwhile, so the partition's commit cannot pass it, and if
// the process stops, the group redelivers it from the committed offset (with
// Attempt starting again at 1). The runner's RetryPolicy bounds the attempts;
// then DeadLetter writes a copy to the dead-letter topic
// (Config.DeadLetterTopic, by default "<topic>.dlq") with consumer.MetaReason,
// consumer.MetaAttempts, MetaOriginTopic, MetaOriginPartition,
// MetaOriginOffset, MetaGroup, consumer.MetaKey and consumer.MetaDeadLetteredAt, waits
// for all in-sync replicas, and only then commits. A poison message holds
// back its partition's commit (and the later messages of its key) for the
// retry policy's total backoff plus the time its dead-letter write takes to
// succeed. If the dead-letter write fails, the message stays uncommitted and
// is handed out again after Config.DeadLetterRetryDelay, so the runner routes
// it again; nothing is lost, but nothing of its partition after it is
// committed either. A write that can never succeed (a missing dead-letter
// topic on a cluster that does not create topics, a denied ACL, a copy larger
// than 1 MiB or than the topic's max.message.bytes) therefore blocks the
// partition's commit for good: the messages settled behind it are
// redelivered after a restart or rebalance (and deduplicated), and once
// Config.MaxUncommitted messages are retained the source stops fetching
// altogether, so memory stays bounded but consumption stops. From the
// Config.deadLetterStuckAfter-th consecutive failure on, every failed write
// of the message is logged at Error level, and Stats.DeadLetterStuck counts
// the message: alert on it, then fix the topic or its ACL. The reason
// header is cut to maxReasonBytes. The dead-letter topic is written at least
// once: deduplicate it on the origin headers.
//
// # Deduplication key
//
// Message.Key is the value of the Config.KeyHeader header ("idempotency-key"
// by default) or the result of Config.KeyFunc. A message without one gets an
// empty Key, and the runner's default key is then Message.ID,
// "topic/partition/offset". That fallback recognises every redelivery of the
// same record (after a crash, a rebalance or a failed commit), but not a
// producer that sends the same event twice (a producer retry without the
// idempotent producer, an outbox relayed twice): those are two records with
// two offsets, and both are applied. Give events a key header, or set
// consumer.Config.KeyFunc to consumer.RequireKey to dead-letter messages that
// have none. A Config.KeyFunc that panics is recovered: the message is
// dead-lettered with consumer.ErrMissingKey and the panic as the reason.
//
// # Rebalances
//
// kafka-go's Reader hides partition assignments. When the group rebalances,
// it stops its partition readers and starts new ones at the committed offsets
// of the partitions this member owns in the new generation; messages fetched
// in the old generation that are still in flight in the runner keep
// running, and their partitions may now belong to another member, which
// fetches them again from the committed offset.
//
// The source fences those stale messages: each fetched message is tagged
// with the reader's rebalance count at the time it was fetched, and a
// partition's commit is sent only if the newest message of its settled prefix
// carries the current count. kafka-go counts a group generation before it
// starts that generation's partition readers, so a message never carries a
// count older than its generation; it also counts a partition reader that
// lost its partition's leader, which only makes the fence skip commits that
// were safe (those offsets are committed with the next message of the
// partition, or redelivered and deduplicated). Acknowledging a stale message
// settles it in this process but commits nothing for its partition; the
// partition's owner in the new generation commits it. Stats.StaleCommitsSkipped
// counts the skipped commits.
//
// Retries and dead letters are fenced too, on the count of generations the
// reader joined (a leader change does not move it): a message fetched in a
// generation that has ended is fetched again from the committed offset by
// its partition's owner in the new one, so its Retry, Release and
// DeadLetter, and a retry pending when it comes due, are dropped (logged at
// Info, counted in Stats.StaleSettlesDropped), and its owner alone routes
// it. A dropped message counts as settled but not durable: no commit of
// this source passes its offset until a message of a later generation at
// or past it is settled.
//
// A commit requested just before a rebalance may still reach the broker after
// it (kafka-go queues it for the next generation). Such a late commit is
// truthful (see above): at worst it moves the partition's offset backwards
// and causes redeliveries; it never skips a message that was not settled.
//
// # Remaining duplicate window
//
// Messages are delivered more than once, and the runner's deduplication turns
// the redeliveries into acknowledgements without running the handler (on the
// transactional path there is no duplicate effect at all; on the lease path
// the lease path's own window applies). A message is redelivered exactly
// when its effect is durable but the offset after it is not committed when
// its partition's reader restarts. That is:
//
//   - after a crash or kill, every message of the partition at or after the
//     last successful commit: the ones in flight, the ones settled behind an
//     unsettled (for example retried) one, and those settled in the last
//     Config.CommitInterval, whose commit was not sent yet;
//   - after a rebalance, the messages in flight and those settled behind an
//     unsettled one, for every partition of this member (also for
//     partitions it keeps, since kafka-go restarts their readers at the
//     committed offset), and the stale messages whose commits were fenced;
//     the settled prefixes are committed as the generation ends;
//   - after a partition leader change, the settled messages of that
//     partition whose commit the fence skipped, until the next message of
//     the partition is settled and committed;
//   - after a failed commit, until the next successful one;
//   - after Close, the messages not settled (Close commits the settled
//     prefixes before leaving the group).
//
// During a rebalance a stale message can be handled by the old and the new
// owner at the same time; the transactional path serialises them on the
// record's row lock, so the handler still runs once. The deduplication store's
// retention must exceed the longest time a message can wait to be
// redelivered, or a late redelivery is applied again. The worst case is a
// group whose committed offsets expired (offsets.retention.minutes after it
// became empty) and that starts again at the oldest retained message:
// Source.RedeliveryHorizon reports the topics' retention.ms for it, and the
// Runner refuses to start when the store's retention is shorter (see
// consumer.HorizonReporter). Kafka deletes whole segments, so on a topic
// with little traffic a message can outlive retention.ms by up to its
// segment.ms; the reported horizon does not include that slack.
//
// Source.Lag reports, per partition, the messages at and after the first one
// not settled (the high watermark minus the next offset to commit), read
// with one ListOffsets request (consumer.LagReporter); otelidemq's
// Hook.ObserveLag exports it as the idemq.kafka.lag gauge.
//
// Attempts are counted in process: after a restart or rebalance a message's
// Attempt starts again at 1. The runner's RetryPolicy does not rely on it
// when its store counts handler failures per key (dedupdriver.Caps.FailureCount:
// pgdedup, sqldedup and redisdedup do): those counts survive restarts and
// rebalances, so a poison message is dead-lettered after MaxAttempts
// failures even if its workers keep restarting.
//
// # Session timeout
//
// A consumer that stops without leaving the group (SIGKILL, OOM kill, a
// crashed node) keeps its partitions until the coordinator has heard no
// heartbeat for Config.SessionTimeout; only then do the survivors rebalance
// and resume them. Close leaves the group at once, so a graceful stop costs
// no such stall. The same timeout decides how long a live member may go
// without heartbeating (a frozen VM, a throttled container, a network blip)
// before it is evicted for nothing: a false rebalance pauses the whole group
// for a moment and redelivers the uncommitted messages, which deduplication
// absorbs. go -C cmd/internal run ./bench/kafkasession measures both (its results
// are in docs/performance.md).
//
// The stall after a kill is SessionTimeout plus up to one HeartbeatInterval
// (the survivors learn of the rebalance at their next heartbeat). CPU load
// alone never delayed a heartbeat enough: kafka-go heartbeats from its own
// goroutine. The defaults are 10 s and 1 s; raise SessionTimeout (Kafka's Java
// client uses 45 s) where members may freeze for longer, for example VMs
// that pause for live migration or containers throttled hard, and lower it
// toward the broker's minimum (group.min.session.timeout.ms, 6 s) where
// partitions must resume fast and the machines never stall.
//
// A broker restart would cost a SessionTimeout too, and the source saves it.
// When kafka-go cannot reach the coordinator it leaves the group with its
// member, which fails while the broker is down, and rejoins as a new member;
// the restarted coordinator reloads the group with the old member and holds
// the new member's join until the old one left or its session expired
// (SessionTimeout after the reload). The source sends that member's
// LeaveGroup itself, again every 100 ms, until the coordinator reports that
// it no longer knows the member (Stats.MembersLeft counts them), so the
// group resumes once the coordinator has loaded it and kafka-go's next join
// attempt (Config.JoinGroupBackoff, 200 ms) arrives, not a SessionTimeout
// later (docs/chaos.md has the figures).
//
// # Brokers
//
// The source uses only the Kafka protocol through kafka-go (a consumer group,
// fetch, offset commit, produce with acks=all; CreateTopics and DeleteTopics
// for tests and demos), so it runs against Apache Kafka and against in-process
// fakes such as franz-go's kfake. Config.Dialer carries TLS, SASL and a custom
// dial function to the reader and the dead-letter writer alike; give
// CreateTopics and DeleteTopics the same dialer.
//
// New checks that one of Config.Brokers answers a metadata request within
// Config.ConnectTimeout (5 s) and fails with ErrUnreachable otherwise, so a
// wrong address or a cluster that is down is reported at start instead of a
// source that waits in silence. Source.Ping repeats the check for health
// endpoints. A cluster lost later makes Receive return the fetch errors; the
// consumer.Runner counts them, logs one ERROR line after
// consumer.Config.OutageThreshold of them in a row, and reports them in
// Runner.Health.
//
// # Telemetry
//
// Message.Broker says, in the terms of the OpenTelemetry messaging
// conventions, where a message came from: messaging.system "kafka", the
// first of Config.Brokers as server.address and server.port, the
// destination's messaging.consumer.group.name (Config.GroupID) and
// messaging.destination.partition.id, the message's messaging.kafka.offset
// and messaging.kafka.message.key (when it has a key), "commit" as the name
// of an acknowledgement, SyntheticID (Message.ID is made of topic, partition
// and offset) and UnmarkedRedeliveries (a message fetched again after a
// rebalance or a lost offset commit has Attempt 1).
package kafkasource
