package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
)

// Sentinel errors. Match them with errors.Is; the dead-letter reason a source
// records wraps one of them.
var (
	// ErrClosed is returned by a Source used after Close.
	ErrClosed = errors.New("idemq: source closed")
	// ErrMissingKey reports a message without a deduplication key: the
	// KeyFunc returned "" or an error, or panicked (the error then also
	// wraps a *PanicError), or the source could not read the key
	// (Delivery.KeyErr). It is routed to the dead-letter destination without
	// retries.
	ErrMissingKey = errors.New("idemq: message has no deduplication key")
	// ErrInvalidKey reports a deduplication key that no store or downstream
	// header can hold: not valid UTF-8, containing a control character (NUL,
	// CR, LF, TAB, DEL or a C1 control), or longer than MaxKeyBytes. It is
	// routed to the dead-letter destination without retries.
	ErrInvalidKey = errors.New("idemq: invalid deduplication key")
	// ErrMalformed reports a body that cannot be decoded (see JSON and
	// TxJSON). It is routed to the dead-letter destination without retries.
	ErrMalformed = errors.New("idemq: malformed message body")
	// ErrOversized reports a body larger than Config.MaxMessageBytes. It is
	// routed to the dead-letter destination without retries.
	ErrOversized = errors.New("idemq: message body too large")
	// ErrPayloadMismatch reports a key that was processed before with a
	// different payload. It is routed to the dead-letter destination as
	// poison; the stored effect is left alone. It is dedup.ErrPayloadMismatch.
	ErrPayloadMismatch = dedup.ErrPayloadMismatch
	// ErrMaxAttempts is matched by the error of a message that failed
	// RetryPolicy.MaxAttempts times and was dead-lettered. That error
	// also wraps the last failure, and its text starts with it:
	// "<last error> (idemq: retries exhausted after 5 attempts)".
	ErrMaxAttempts = errors.New("idemq: retries exhausted")
	// ErrHandlerPanic is matched by the error of a handler that panicked.
	ErrHandlerPanic = errors.New("idemq: handler panicked")

	// ErrFenced is matched by the error a Source's Retry, Release or
	// DeadLetter returns when it dropped that settle because the message is
	// no longer its own: it was received before the source lost the
	// message's partition (a Kafka consumer-group rebalance), and the
	// partition's new owner receives and settles it again. The runner
	// leaves such a message to the broker: it is not counted as a dead
	// letter or a settle failure, and no OnDeadLetter hook sees it.
	ErrFenced = errors.New("idemq: settle fenced: the message's partition has a new owner")

	// ErrKeyBusy is matched by the reason a message is released for (see
	// Releaser) when another worker holds its key's lease right now (lease
	// path): it is neither run nor acknowledged but handed back, to find
	// out later whether that worker completed the key.
	ErrKeyBusy = errors.New("idemq: key being handled by another worker")
)

// PanicError is the error of a handler or a Config.KeyFunc that panicked. A
// handler's panic rolls back its transaction and the message is retried like
// any failure; a KeyFunc's panic dead-letters the message at once, wrapped in
// ErrMissingKey. Stack is the panicking goroutine's stack; the runner logs
// it under LogKeyStack on the line that retries (at ERROR) or dead-letters
// the message.
type PanicError struct {
	Value any
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string { return fmt.Sprintf("idemq: handler panicked: %v", e.Value) }

// Is makes errors.Is(err, ErrHandlerPanic) true.
func (e *PanicError) Is(target error) bool { return target == ErrHandlerPanic }

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so that the runner dead-letters the message at once
// instead of retrying it. Use it for input that can never succeed (an unknown
// account, a validation failure). Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent or is one of the input errors that are never retried
// (ErrMissingKey, ErrInvalidKey, ErrMalformed, ErrOversized,
// ErrPayloadMismatch).
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p) ||
		errors.Is(err, ErrMissingKey) || errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrMalformed) ||
		errors.Is(err, ErrOversized) || errors.Is(err, ErrPayloadMismatch)
}

// retryAfterError asks for a retry after a given delay.
type retryAfterError struct {
	delay time.Duration
	err   error
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("retry after %s: %v", e.delay, e.err)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter wraps err so that the runner retries the message after delay
// instead of after the policy's backoff. The attempt still counts towards
// RetryPolicy.MaxAttempts. RetryAfter(d, nil) returns nil.
func RetryAfter(delay time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{delay: delay, err: err}
}

// DeadLetterError is the reason handed to Source.DeadLetter. It carries the
// attempt count (the handler failures counted by the store, else the broker's
// delivery count) and the final error, which wraps the sentinel that explains
// the route (ErrMaxAttempts, ErrMissingKey, ErrPayloadMismatch, ...).
//
// Its text, which the sources write as the dead letter's reason
// (MetaReason), starts with the cause and ends with the route, so that a
// reason cut short still shows the cause:
//
//	card declined (idemq: retries exhausted after 5 attempts)
//	permanent: unknown account (idemq: dead-lettered after 1 attempt)
type DeadLetterError struct {
	Key      string
	Attempts int
	Err      error
}

// Error implements error.
func (e *DeadLetterError) Error() string {
	var ex *exhaustedError
	if errors.As(e.Err, &ex) {
		return ex.Error() // "<last error> (idemq: retries exhausted after n attempts)"
	}
	return fmt.Sprintf("%v (idemq: dead-lettered after %s)", e.Err, attempts(e.Attempts))
}

// exhaustedError is the error of a message that failed
// RetryPolicy.MaxAttempts times: its last failure, then the count. It
// matches ErrMaxAttempts and the last failure.
type exhaustedError struct {
	attempts int
	err      error
}

func (e *exhaustedError) Error() string {
	return fmt.Sprintf("%v (%v after %s)", e.err, ErrMaxAttempts, attempts(e.attempts))
}

func (e *exhaustedError) Unwrap() []error { return []error{ErrMaxAttempts, e.err} }

// attempts is "1 attempt" or "n attempts".
func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// Unwrap returns the final error.
func (e *DeadLetterError) Unwrap() error { return e.Err }

// Dead-letter metadata (Meta*): the names of the headers (Kafka, AMQP) or message
// attributes (SQS) that every source writes on a dead-lettered copy, so that
// a tool reading a dead-letter destination finds the same names whatever the
// broker. These are the only names of this metadata: a source adds its
// broker's own fields (kafkasource.MetaOriginTopic, amqpsource.MetaOriginQueue,
// sqssource.MetaOriginQueue, ...) under the same Meta prefix.
const (
	// MetaReason holds the dead-letter reason: the text of the error
	// passed to Source.DeadLetter.
	MetaReason = "idemq-reason"
	// MetaAttempts holds the number of attempts made, in decimal.
	MetaAttempts = "idemq-attempts"
	// MetaKey holds the deduplication key of the message, when it has
	// one.
	MetaKey = "idemq-key"
	// MetaDeadLetteredAt holds when the message was dead-lettered (RFC 3339).
	MetaDeadLetteredAt = "idemq-dead-lettered-at"
)
