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
// line is `idemq dlq list|show|replay|purge`.
//
// # Replay is at least once and loses nothing
//
// A replay sends a copy of each selected dead letter to its origin topic or
// queue, with its key, body and the user's headers or attributes, and
// without idemq's dead-letter metadata, and removes the dead letter only
// after the broker confirmed the copy (Kafka acks=all, RabbitMQ publisher
// confirms, SQS SendMessage). An interrupted replay (an error, Ctrl-C, a
// killed process) is run again: it goes on with the dead letters that are
// left, and the one whose copy was confirmed but not yet removed is sent a
// second time. The runner absorbs that second copy, as it absorbs the
// replay of a message whose key was applied meanwhile: its processed
// record makes it a duplicate.
//
// The runner forgets a key's failure count after it dead-lettered the
// message (dedupdriver.Caps.FailureCount), so a replayed message gets the full
// RetryPolicy again; Options.Failures forgets it once more, for a count the
// runner could not delete.
package dlq
