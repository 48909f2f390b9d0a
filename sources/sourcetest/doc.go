// Package sourcetest is the conformance suite every consumer.Source adapter
// runs against its real broker.
//
// An adapter's test builds a Harness (how to make a fresh topic, open a
// source on it, publish to it and, optionally, read its dead letters and
// restart the broker), declares what its broker can promise in Features, and
// calls Run:
//
//	func TestConformance(t *testing.T) {
//		sourcetest.Run(t, sourcetest.Harness{
//			Features:  sourcetest.Features{CompetingConsumers: true},
//			NewTopic:  func(t *testing.T) string { ... },
//			NewSource: func(t *testing.T, topic string) consumer.Source { ... },
//			Publish:   func(t *testing.T, topic string, msgs ...sourcetest.Outgoing) { ... },
//		})
//	}
//
// Run executes every test as a parallel subtest on its own topic, so one
// adapter's suite finishes in about the time of its slowest test. Tests whose
// guarantee the broker does not give are skipped according to Features.
//
// What the suite checks, each with a bounded wait and a failure message that
// says what was missing:
//
//   - every published message is received and, once acknowledged, never
//     delivered again, not even to a new source;
//   - acknowledging some messages never acknowledges the others (a
//     cumulative offset commit past an unacknowledged message would lose it);
//   - a redelivery keeps Message.ID and Message.Key, and its Attempt never
//     goes down (and grows after Retry);
//   - Retry redelivers (not before the delay when RetryDelayHonoured);
//   - closing a source without acknowledging returns its messages to a new
//     source within Features.RedeliveryTimeout;
//   - DeadLetter removes a message for good and, when DeadLetterReadable, its
//     dead letter carries the reason;
//   - a real consumer.Runner over the source acknowledges a message only
//     after the transaction that recorded its key committed, and every effect
//     is applied exactly once;
//   - competing sources share a topic without applying any effect twice;
//   - same-PartitionKey messages arrive in publish order when
//     OrderedByPartitionKey;
//   - a cancelled Receive returns promptly, Close is idempotent, and methods
//     called after Close fail with consumer.ErrClosed;
//   - a broker restart in the middle of consumption loses nothing and applies
//     nothing twice (when Restart).
//
// The restart test runs alone, after the parallel tests, because a broker
// restart would disturb them. Set IDEMQ_SOURCETEST_STRESS=1 to run the
// delivery and runner tests with many more messages.
//
// The Runner tests use an in-memory transactional store, so they check the
// source's part of the contract (settling the right messages at the right
// time) independently of any database; adapters add their own end-to-end
// tests against PostgreSQL.
//
// Beside the suite, RunCrashLoop is a scenario shared by the adapters whose
// broker counts deliveries: a worker process (CrashLoopWorker, started with
// runtest.StartChild) is SIGKILLed again and again with one message in
// flight, and the runner must count only handler failures as attempts.
package sourcetest
