package consumer

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"github.com/idemq/idemq/internal/cfgerr"
)

// Config configures a Runner. The zero value of every field except Name is a
// usable default; WithDefaults fills them in and NewRunner validates the result.
type Config struct {
	// Name names the consumer. It is the scope of deduplication records:
	// two runners with the same Name deduplicate against each other, runners
	// with different names (different services reading the same topic) do
	// not. Required.
	Name string

	// Concurrency is the number of batches handled at the same time, each in
	// its own goroutine and transaction. Messages with the same
	// PartitionKey (or, without one, the same deduplication key) always go to
	// the same goroutine, in delivery order. Each goroutine buffers up to
	// BatchSize messages; when one is full (a slow key), receiving pauses
	// until it drains, which bounds memory. On the transactional path each
	// goroutine holds a database connection for its whole transaction, so
	// the store's connection pool must be larger than Concurrency (NewRunner
	// checks it where the store reports its pool size, dedupdriver.Caps.Pool).
	// Defaults to 4, or to one less than the store's pool when that is
	// smaller (pgxpool's default pool is 4 connections or the number of
	// CPUs, whichever is larger).
	Concurrency int

	// BatchSize is the largest number of messages handled in one database
	// transaction, without savepoints (see Transactional for a failure in
	// a batch). A lane never waits for a batch to fill (unless BatchWait
	// says so): it takes the messages already queued for it, up to
	// BatchSize, so an idle worker handles a lone message at once in a
	// transaction of its own, and a worker with a backlog shares one
	// transaction ID, one claim and one commit among up to BatchSize
	// messages. Defaults to 100.
	//
	// The trade-off: a batch holds the row locks of all its handlers until
	// it commits. Handlers of different lanes that write the same rows in
	// different orders deadlock, and although a deadlock costs no attempt,
	// under such contention a batch runs slower than one message per
	// transaction. Give such messages a PartitionKey (the rows they write,
	// so that one lane serializes them), or set BatchSize to 1. A failing
	// handler also reruns the messages before it in its batch, and each
	// lane buffers up to BatchSize messages received ahead.
	// docs/performance.md has the measurements.
	BatchSize int

	// BatchWait is how long a lane with fewer than BatchSize messages queued
	// waits for more before it starts the batch, counted from the moment it
	// took the batch's first message. 0 (the default) starts a batch with
	// whatever is queued, without waiting. Brokers that hand out few
	// messages per call (SQS: at most 10, spread over Concurrency lanes)
	// fill batches slowly; a wait of a few tens of milliseconds gathers more
	// per transaction, and adds up to BatchWait to the latency of a message
	// that arrives alone. Ignored at BatchSize 1.
	BatchWait time.Duration

	// HandlerTimeout bounds one handler call; its context is cancelled when
	// it passes, and the message is retried. Defaults to 30 s.
	HandlerTimeout time.Duration

	// KeyFunc returns a message's deduplication key. An error, an empty key
	// or a panic routes the message to the dead-letter destination with
	// ErrMissingKey (a panic also as a *PanicError); a key with a control
	// character, invalid UTF-8 or over MaxKeyBytes with ErrInvalidKey.
	// Defaults to DefaultKey (the message's Key, else its broker ID); use
	// RequireKey to refuse messages without a key of their own.
	KeyFunc func(*Message) (string, error)

	// Retry is the retry policy for failed handlers and failed transactions.
	// See RetryPolicy for its defaults.
	Retry RetryPolicy

	// MaxMessageBytes is the largest body accepted; larger messages are
	// dead-lettered with ErrOversized. Defaults to 4 MiB. Negative means no
	// limit.
	MaxMessageBytes int

	// MaxResultBytes is the largest result a handler may return through
	// TxResult or Result (see StoredResult). On the transactional
	// path a larger result rolls the handler's writes back and dead-letters
	// the message with ErrResultTooLarge, without retries; on the lease
	// path, where the effect has happened, the key is marked done without
	// the result and the message is dead-lettered with ErrResultTooLarge.
	// The result is stored with the record, for the record's retention.
	// Defaults to 64 KiB. Negative means no limit.
	MaxResultBytes int

	// DrainTimeout bounds how long Run keeps handling messages already
	// received after its context is cancelled. Messages not settled by then
	// are left unacknowledged and return to the broker, and the handlers
	// still running see their context cancelled; Run returns when they do
	// (a handler that ignores its context delays it). Defaults to 30 s.
	DrainTimeout time.Duration

	// OutageThreshold is the number of consecutive failures of one
	// dependency (the broker's Receive, its Ack, its Retry, Release and
	// DeadLetter, the store) after which the runner logs one ERROR line
	// naming it and the error, and Health reports it and, but for the
	// broker's Retry, Release and DeadLetter, is no longer Ready. One INFO
	// line reports the recovery. Once the store has failed that often, the
	// runner also stops receiving (back-pressure: the messages would only
	// go back to the broker) and probes the store every 500 ms, receiving
	// again once it answers. Defaults to 3.
	OutageThreshold int

	// OutageReminder is the least time between two ERROR lines about one
	// outage that lasts, and between two WARN lines about single failures
	// of that dependency (a failed transaction, receive, ack, retry or
	// dead letter) once the outage is reported. Defaults to 1 min.
	OutageReminder time.Duration

	// Logger receives the runner's logs. Defaults to a logger that discards
	// everything.
	Logger *slog.Logger

	// AllowShortRetention lets Run start although the source's broker may
	// redeliver a message later than the store remembers it (see
	// HorizonReporter); Run then logs one WARN with both durations. It also
	// lowers the WARN about a horizon the source cannot tell
	// (ErrHorizonUnknown) to INFO. Defaults to false: Run refuses with a
	// *idemq.ConfigError.
	AllowShortRetention bool

	// Hooks observe the runner: each is checked once, in NewRunner, for the
	// Hook* interfaces it implements (see Hook), and called on those
	// events. consumer/otelidemq provides OpenTelemetry traces and metrics
	// as a hook. Defaults to none, which costs nothing.
	Hooks []Hook
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Concurrency = cmp.Or(c.Concurrency, 4)
	c.BatchSize = cmp.Or(c.BatchSize, 100)
	c.HandlerTimeout = cmp.Or(c.HandlerTimeout, 30*time.Second)
	if c.KeyFunc == nil {
		c.KeyFunc = DefaultKey
	}
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, 4<<20)
	c.MaxResultBytes = cmp.Or(c.MaxResultBytes, 64<<10)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, 30*time.Second)
	c.OutageThreshold = cmp.Or(c.OutageThreshold, 3)
	c.OutageReminder = cmp.Or(c.OutageReminder, time.Minute)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	c.Retry = c.Retry.WithDefaults()
	return c
}

// validate reports every invalid field of c (see idemq.ConfigError).
func (c Config) validate() error {
	var l cfgerr.List
	if c.Name == "" {
		l.Add("Name", "required (it scopes deduplication records)")
	} else if len(c.Name) > 200 {
		l.Add("Name", "longer than 200 bytes")
	}
	if c.Concurrency < 1 {
		l.Add("Concurrency", "must be at least 1")
	}
	if c.BatchSize < 1 {
		l.Add("BatchSize", "must be at least 1")
	}
	if c.BatchWait < 0 {
		l.Add("BatchWait", "must not be negative")
	}
	if c.HandlerTimeout < 0 {
		l.Add("HandlerTimeout", "must not be negative")
	}
	if c.DrainTimeout < 0 {
		l.Add("DrainTimeout", "must not be negative")
	}
	if c.OutageThreshold < 1 {
		l.Add("OutageThreshold", "must be at least 1")
	}
	if c.OutageReminder < 0 {
		l.Add("OutageReminder", "must not be negative")
	}
	l.Include(c.Retry.validate())
	return l.Err()
}

// DefaultKey is the default Config.KeyFunc: the message's Key, else its
// broker ID (Kafka topic/partition/offset, SQS MessageId, AMQP message-id).
//
// The ID fallback catches redeliveries of one broker message (a lost ack, a
// crash, a rebalance, an expired visibility timeout), which carry the same
// ID. It does not catch a producer that sends the same event twice without a
// key: each send is a new broker message with a new ID, so both run. Use
// RequireKey when producers may resend.
func DefaultKey(m *Message) (string, error) {
	if m.Key != "" {
		return m.Key, nil
	}
	return m.ID, nil
}

// RequireKey is a Config.KeyFunc for every source that accepts only a key of
// the message's own (Message.Key: an idempotency header or attribute, or the
// result of the source's key setting), never a broker ID. A message without
// one is dead-lettered at once with ErrMissingKey, so that a producer
// re-send without a key cannot slip through as a new message.
func RequireKey(m *Message) (string, error) {
	switch {
	case m.Key != "":
		return m.Key, nil
	case m.ID == "":
		return "", fmt.Errorf("%w: a message from %q carries neither a key nor a broker id", ErrMissingKey, m.Topic)
	default:
		return "", fmt.Errorf("%w: message %s from %q carries no key of its own (RequireKey ignores broker ids)", ErrMissingKey, m.ID, m.Topic)
	}
}

// RetryPolicy says how often and how fast a failing message is retried before
// it is dead-lettered. The delay after the n-th failed attempt is
// InitialBackoff × Multiplier^(n-1) with ±Jitter applied, capped at
// MaxBackoff (see MaxAttempts for what counts as an attempt).
type RetryPolicy struct {
	// MaxAttempts is the number of attempts after which a failing message is
	// dead-lettered with ErrMaxAttempts. An attempt is a handler failure as
	// the path's store counts it per key (dedupdriver.Caps.FailureCount), so
	// deliveries to consumers that crashed or were killed do not count; with
	// a store that cannot count, or when counting fails, it is the broker's
	// delivery count, Message.Attempt. Defaults to 5.
	MaxAttempts int
	// InitialBackoff is the delay before the second attempt. Defaults to
	// 200 ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the delay. Defaults to 30 s.
	MaxBackoff time.Duration
	// Multiplier grows the delay between attempts. Defaults to 2.
	Multiplier float64
	// Jitter is the fraction of the delay drawn at random, in [0, 1), so
	// that retries of many messages spread out. Defaults to 0.2; a negative
	// value disables jitter.
	Jitter float64
}

// WithDefaults returns a copy of p with every zero field set to its default.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	p.MaxAttempts = cmp.Or(p.MaxAttempts, 5)
	p.InitialBackoff = cmp.Or(p.InitialBackoff, 200*time.Millisecond)
	p.MaxBackoff = cmp.Or(p.MaxBackoff, 30*time.Second)
	p.Multiplier = cmp.Or(p.Multiplier, 2)
	p.Jitter = cmp.Or(p.Jitter, 0.2)
	return p
}

func (p RetryPolicy) validate() error {
	var l cfgerr.List
	if p.MaxAttempts < 1 {
		l.Add("Retry.MaxAttempts", "must be at least 1")
	}
	switch {
	case p.InitialBackoff < 0 || p.MaxBackoff < 0:
		l.Add("Retry", "backoff must not be negative")
	case p.MaxBackoff < p.InitialBackoff:
		l.Add("Retry.MaxBackoff", "smaller than InitialBackoff")
	}
	// Written so that NaN fails every check.
	if !(p.Multiplier >= 1) || math.IsInf(p.Multiplier, 0) {
		l.Add("Retry.Multiplier", "must be a finite number of at least 1")
	}
	if !(p.Jitter < 1) || math.IsInf(p.Jitter, 0) {
		l.Add("Retry.Jitter", "must be a finite number below 1")
	}
	return l.Err()
}

// Backoff returns the delay before the attempt that follows attempt (1-based).
// It saturates: whatever the policy holds (even an unvalidated one with NaN or
// values near math.MaxInt64), the result is within [0, MaxBackoff], the
// jitter included.
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	ceil := max(p.MaxBackoff, 0)
	if attempt < 1 {
		attempt = 1
	}
	d := float64(p.InitialBackoff) * math.Pow(p.Multiplier, float64(attempt-1))
	if p.Jitter > 0 && p.Jitter < 1 {
		d *= 1 + p.Jitter*(2*rand.Float64()-1)
	}
	switch {
	case math.IsNaN(d) || d >= float64(ceil):
		// float64(ceil) may round above ceil: convert ceil, never d.
		return ceil
	case d <= 0:
		return 0
	}
	return time.Duration(d)
}
