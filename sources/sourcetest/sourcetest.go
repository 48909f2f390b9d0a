package sourcetest

import (
	"os"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
)

// Outgoing is a message the suite publishes through Harness.Publish.
type Outgoing struct {
	// Key is the message's deduplication key. The source must surface it as
	// Message.Key on receive (an idempotency header, attribute or message
	// id). The suite always sets it.
	Key string
	// Body is the payload.
	Body []byte
	// Headers are extra headers or string attributes; may be nil.
	Headers map[string]string
	// PartitionKey orders messages (Kafka message key, SQS MessageGroupId);
	// empty when the test does not care about order.
	PartitionKey string
}

// Features declares what a source's broker guarantees. A test of a guarantee
// the broker does not give is skipped.
type Features struct {
	// CompetingConsumers reports that sources opened on one topic share its
	// messages (a consumer group, competing queue consumers).
	CompetingConsumers bool
	// OrderedByPartitionKey reports that messages with the same
	// PartitionKey are received in publish order.
	OrderedByPartitionKey bool
	// RetryDelayHonoured reports that a message handed to Retry(msg, d) is
	// not redelivered before d has passed.
	RetryDelayHonoured bool
	// RedeliveryTimeout is the longest the broker takes to redeliver a
	// message that was received but not acknowledged, after its Source was
	// closed (for example the SQS visibility timeout). It also bounds the
	// quiet window in which the suite checks that acknowledged messages do
	// not come back. Zero means 10 s.
	RedeliveryTimeout time.Duration
	// DeliveryTimeout bounds how long a message the suite waits for may
	// take to arrive: a published one, or one handed back, on top of
	// RedeliveryTimeout or the retry's delay. A test still waiting then
	// fails. Zero means 30 s; an in-memory broker can set a few seconds, so
	// that a source losing a message fails in seconds.
	DeliveryTimeout time.Duration
	// PartialAck reports that the source's Ack acknowledges the messages
	// of a call that it can and returns an error naming the others (as
	// memsource does with an expired delivery): the suite then acks each
	// message of a failed call again on its own to learn which were
	// acknowledged. Leave it false for brokers where acknowledging twice
	// is an error of the connection (AMQP).
	PartialAck bool
	// DeadLetterReadable reports that Harness.DeadLetters reads the
	// dead-letter destination.
	DeadLetterReadable bool
	// Restart reports that Harness.RestartBroker is set, so the reconnect
	// test runs.
	Restart bool
}

// Harness tells the suite how to drive one source adapter against its broker.
// Every function receives the calling subtest's *testing.T and must fail it
// (t.Fatal) rather than return an error. The functions are called from
// parallel subtests and must be safe for concurrent use.
type Harness struct {
	// Features declares what the broker guarantees.
	Features Features
	// NewTopic creates a fresh topic or queue (and its dead-letter
	// destination) used by one test only. Required.
	NewTopic func(t *testing.T) string
	// NewSource opens a source on topic. Sources opened on the same topic
	// belong to the same consumer group and compete for its messages. The
	// suite closes every source it opens; the harness may also close it in
	// t.Cleanup. Required.
	NewSource func(t *testing.T, topic string) consumer.Source
	// Publish publishes msgs to topic, in order. The messages are durable
	// when it returns. Required.
	Publish func(t *testing.T, topic string, msgs ...Outgoing)
	// DeadLetters returns the messages dead-lettered from topic so far, with
	// the reason in Headers[consumer.MetaReason], the name every source
	// writes; the suite checks that it is present. Required
	// when Features.DeadLetterReadable.
	DeadLetters func(t *testing.T, topic string) []Outgoing
	// RestartBroker restarts the broker (or cuts and restores the
	// connection to it) and returns once it accepts connections again.
	// Required when Features.Restart.
	RestartBroker func(t *testing.T)
}

// StressEnv is the environment variable that turns on the stress mode: when it
// is "1", the delivery tests run again with many more messages.
const StressEnv = "IDEMQ_SOURCETEST_STRESS"

// defaultRedeliveryTimeout is used when Features.RedeliveryTimeout is zero.
const defaultRedeliveryTimeout = 10 * time.Second

// Run runs the conformance suite against h, each test as a parallel subtest on
// a fresh topic. It fails t at once if a required Harness function is
// missing or a Feature asks for one that is not set.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if !h.validate(t) {
		return
	}
	s := &suite{h: h, stress: os.Getenv(StressEnv) == "1"}
	// The parallel tests finish before the restart test starts: a broker
	// restart would disturb them.
	t.Run("Parallel", func(t *testing.T) {
		for _, tc := range s.tests() {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.run(t)
			})
		}
	})
	t.Run("Restart", s.testRestart)
}

func (h Harness) validate(t *testing.T) bool {
	t.Helper()
	ok := true
	missing := func(field, why string) {
		t.Errorf("sourcetest: Harness.%s is nil; %s", field, why)
		ok = false
	}
	if h.NewTopic == nil {
		missing("NewTopic", "it is required")
	}
	if h.NewSource == nil {
		missing("NewSource", "it is required")
	}
	if h.Publish == nil {
		missing("Publish", "it is required")
	}
	if h.Features.DeadLetterReadable && h.DeadLetters == nil {
		missing("DeadLetters", "Features.DeadLetterReadable needs it")
	}
	if h.Features.Restart && h.RestartBroker == nil {
		missing("RestartBroker", "Features.Restart needs it")
	}
	if h.Features.RedeliveryTimeout < 0 {
		t.Errorf("sourcetest: Features.RedeliveryTimeout is negative (%s)", h.Features.RedeliveryTimeout)
		ok = false
	}
	if h.Features.DeliveryTimeout < 0 {
		t.Errorf("sourcetest: Features.DeliveryTimeout is negative (%s)", h.Features.DeliveryTimeout)
		ok = false
	}
	return ok
}

// suite holds the harness for the tests of one Run.
type suite struct {
	h      Harness
	stress bool
}

type testCase struct {
	name string
	run  func(t *testing.T)
}

func (s *suite) tests() []testCase {
	return []testCase{
		{"PublishReceiveAck", s.testPublishReceiveAck},
		{"CloseRedelivers", s.testCloseRedelivers},
		{"PartialAck", s.testPartialAck},
		{"Retry", s.testRetry},
		{"DeadLetter", s.testDeadLetter},
		{"RunnerAcksAfterCommit", s.testRunnerAcksAfterCommit},
		{"CompetingConsumers", s.testCompetingConsumers},
		{"OrderedByPartitionKey", s.testOrderedByPartitionKey},
		{"CancelAndClose", s.testCancelAndClose},
	}
}

// scale returns n, or stress in the stress mode (StressEnv).
func (s *suite) scale(n, stress int) int {
	if s.stress {
		return stress
	}
	return n
}

// deliveryTimeout returns Features.DeliveryTimeout or its default.
func (s *suite) deliveryTimeout() time.Duration {
	if d := s.h.Features.DeliveryTimeout; d > 0 {
		return d
	}
	return defaultDeliveryTimeout
}

func (s *suite) redeliveryTimeout() time.Duration {
	if d := s.h.Features.RedeliveryTimeout; d > 0 {
		return d
	}
	return defaultRedeliveryTimeout
}
