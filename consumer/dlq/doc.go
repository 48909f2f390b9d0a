// Package dlq lists, inspects, replays and purges dead letters: the
// messages the runner gave up on, which every source routes to a
// dead-letter destination with their reason, attempts, key and origin
// (consumer.MetaReason, MetaAttempts, MetaKey, MetaDeadLetteredAt).
//
// Each broker's dead-letter store, beside its source, is a Broker:
// sources/kafkasource/kafkadlq ("<topic>.dlq"), sources/sqssource/sqsdlq
// (the dead-letter queue), sources/amqpsource/amqpdlq (the queue behind the
// dead-letter exchange). List, Replay and Purge work on any of them through
// a Filter (reason, key glob, time range, limit, IDs or keys); the command
// line is `idemq dlq list|show|replay|purge` (docs/operations.md, "Dead
// letters").
//
// A replay is at least once and loses nothing: a dead letter is removed
// only after its origin confirmed the copy, so an interrupted replay is run
// again, and the copy sent twice is absorbed by the runner's processed
// record (see Broker.Scan and Replay).
package dlq
