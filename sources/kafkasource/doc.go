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
// This page states the contracts; docs/sources.md ("Kafka") explains how
// commits, order, retries, rebalances and the session timeout work, and the
// trade-offs of their settings.
//
// # Commits
//
// Messages are fetched with Reader.FetchMessage, never ReadMessage. Ack and
// DeadLetter, which the runner calls once a message's effect (or its
// dead-letter copy) is durable, only request the commit: for each partition
// the source commits the offset after the longest prefix of its fetched
// messages that are settled (acknowledged or dead-lettered), at most once
// per Config.CommitInterval, when the group rebalances, and on Close. The
// committed offset is therefore always truthful: every message below it was
// settled by this source, or lies below the offset the partition's reader
// started from, which was itself committed truthfully.
//
// # Order, retries and dead letters
//
// Message.PartitionKey is the Kafka message key (Config.Ordering =
// OrderByKey), so the runner handles the messages of one key in offset
// order; OrderByPartition orders whole partitions. Retry hands a message out
// again in process and holds back the later messages of its key fetched
// after the failure until it is settled. DeadLetter writes a copy to the
// dead-letter topic (Config.DeadLetterTopic, by default "<topic>.dlq") and
// commits only once every in-sync replica has it; a message whose copy
// cannot be written stays uncommitted, so its partition's commit waits for
// it (Stats.DeadLetterStuck). The dead-letter topic is written at least
// once: deduplicate it on the origin headers.
//
// # Deduplication key
//
// Message.Key is the value of the Config.KeyHeader header
// ("idempotency-key" by default) or the result of Config.KeyFunc. A message
// without one gets an empty Key, and the runner's default key is then
// Message.ID, "topic/partition/offset". That fallback recognises every
// redelivery of the same record (after a crash, a rebalance or a failed
// commit), but not a producer that sends the same event twice (a producer
// retry without the idempotent producer, an outbox relayed twice): those are
// two records with two offsets, and both are applied. Give events a key
// header, or set consumer.Config.KeyFunc to consumer.RequireKey to
// dead-letter messages that have none.
//
// # Rebalances
//
// A message fetched in a consumer-group generation that has ended is stale:
// its partition's owner in the new generation fetches it again from the
// committed offset. Acknowledging a stale message commits nothing
// (Stats.StaleCommitsSkipped), and its Retry, Release and DeadLetter are
// dropped with consumer.ErrFenced (Stats.StaleSettlesDropped): the new
// owner alone routes it.
//
// # Remaining duplicate window
//
// The runner's deduplication turns redeliveries into acknowledgements
// without running the handler. A message is redelivered when its effect is
// durable but the offset after it is not committed when its partition's
// reader restarts:
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
// A redelivered message has Attempt 1 again. The deduplication store's
// retention must exceed the longest time a message can wait to be
// redelivered: Source.RedeliveryHorizon reports the topics' retention.ms,
// and the Runner refuses to start when the store's retention is shorter
// (see consumer.HorizonReporter).
package kafkasource
