package dlq

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
)

// PreviewBytes is how many bytes of a dead letter's body Letter.Body holds.
const PreviewBytes = 256

// Letter is one dead letter, as a broker's dead-letter store holds it.
type Letter struct {
	// ID names the dead letter in its store, and stays the same while it
	// is there (whatever is replayed or purged around it):
	// "partition/offset" on Kafka, the dead-letter queue's MessageId on
	// SQS, the MessageId on RabbitMQ, else DigestID of the dead letter's
	// headers and body. Dead letters that are copies of one message may
	// share an ID, which then names them all.
	ID string
	// Key is the message's deduplication key (consumer.MetaKey), "" when
	// the dead letter names none.
	Key string
	// Reason is why it was dead-lettered (consumer.MetaReason; on RabbitMQ
	// the broker's own reason for a message the broker dead-lettered).
	Reason string
	// Attempts is the number of attempts made (consumer.MetaAttempts), 0
	// when unknown.
	Attempts int
	// Origin is the topic or queue (SQS: queue URL) the message came from,
	// where a replay sends it.
	Origin string
	// DeadLetteredAt is when it was dead-lettered
	// (consumer.MetaDeadLetteredAt; on SQS the dead-letter queue's
	// SentTimestamp); the zero time when unknown.
	DeadLetteredAt time.Time
	// Body is the first PreviewBytes bytes of the body.
	Body []byte
	// Size is the body's full length in bytes.
	Size int
	// Headers are the user's headers or message attributes (string values
	// only), which a replay keeps; idemq's dead-letter metadata is not
	// among them.
	Headers map[string]string
}

// Filter selects dead letters. The zero Filter selects every one.
type Filter struct {
	// Reason selects the dead letters whose reason contains it
	// (case-insensitive). Empty: any reason.
	Reason string
	// Key selects the dead letters whose key matches this glob (path.Match
	// syntax: *, ?, [a-z]). Empty: any key, none included.
	Key string
	// Since and Until select the dead letters dead-lettered at or after
	// Since and before Until. A zero bound is open. A dead letter whose
	// time is unknown matches only when both bounds are zero.
	Since, Until time.Time
	// Limit is the largest number of dead letters selected. 0: no limit.
	Limit int
	// IDs selects the dead letters whose ID or key is one of them. Empty:
	// any.
	IDs []string
}

// Selective reports whether f selects fewer than every dead letter: it has
// a condition or a Limit.
func (f Filter) Selective() bool {
	return f.Reason != "" || f.Key != "" || !f.Since.IsZero() || !f.Until.IsZero() || f.Limit != 0 || len(f.IDs) > 0
}

// Validate reports a Filter that can never work: a malformed key glob or
// Until not after Since.
func (f Filter) Validate() error {
	if f.Key != "" {
		if _, err := path.Match(f.Key, ""); err != nil {
			return fmt.Errorf("dlq: key glob %q: %w", f.Key, err)
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return fmt.Errorf("dlq: until (%s) is not after since (%s)", f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339))
	}
	if f.Limit < 0 {
		return fmt.Errorf("dlq: negative limit %d", f.Limit)
	}
	return nil
}

// Match reports whether l is selected by f's conditions (Limit aside).
func (f Filter) Match(l *Letter) bool {
	if f.Reason != "" && !strings.Contains(strings.ToLower(l.Reason), strings.ToLower(f.Reason)) {
		return false
	}
	if f.Key != "" {
		if ok, _ := path.Match(f.Key, l.Key); !ok {
			return false
		}
	}
	if len(f.IDs) > 0 && !slices.Contains(f.IDs, l.ID) && (l.Key == "" || !slices.Contains(f.IDs, l.Key)) {
		return false
	}
	if t := l.DeadLetteredAt; !f.Since.IsZero() || !f.Until.IsZero() {
		return !t.IsZero() && !t.Before(f.Since) && (f.Until.IsZero() || t.Before(f.Until))
	}
	return true
}

// Action is what a Broker's Scan does with the dead letter it visits.
type Action int

const (
	// ActionKeep leaves the dead letter where it is.
	ActionKeep Action = iota
	// ActionReplay sends a copy to the dead letter's origin, waits until the
	// broker confirmed it, and only then removes the dead letter.
	ActionReplay
	// ActionPurge removes the dead letter.
	ActionPurge
	// ActionStop leaves the dead letter where it is and ends the scan.
	ActionStop
)

// Broker is the dead-letter store of one broker (kafkadlq, sqsdlq,
// amqpdlq). Its methods are not safe for concurrent use.
type Broker interface {
	// Scan visits the dead letters in the store's order (Kafka: partition
	// by partition, by offset; SQS: as received; RabbitMQ: queue order),
	// each once, until visit returns ActionStop or every dead letter
	// present when Scan started was visited, and applies the Action visit
	// returns to each. An ActionReplay removes the dead letter only after
	// the origin confirmed its copy, so a Scan interrupted at any point (an
	// error, a crash) loses nothing: it can be run again, and a dead letter
	// whose copy was confirmed but not removed is sent again (the runner
	// absorbs it as a duplicate of its key). A replayed copy keeps the
	// body, the user's headers and the key the runner recorded (where the
	// origin takes its key from elsewhere, such as a Kafka offset or an SQS
	// deduplication id, the copy carries it in the source's key header or
	// attribute), and drops the rest of idemq's dead-letter metadata. Scan
	// returns the first error that stopped it; done is the
	// number of ActionReplay and ActionPurge actions completed before it.
	Scan(ctx context.Context, visit func(*Letter) Action) (done int, err error)
	// Close releases the broker's connections.
	Close() error
}

// ErrNoOrigin reports a dead letter that names no origin, which Replay
// cannot send anywhere (it is left in the dead-letter store).
var ErrNoOrigin = errors.New("dlq: the dead letter names no origin")

// List returns the dead letters that f selects, in the store's order, without
// changing the dead-letter store.
func List(ctx context.Context, b Broker, f Filter) ([]*Letter, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	var out []*Letter
	_, err := b.Scan(ctx, func(l *Letter) Action {
		if f.Limit > 0 && len(out) >= f.Limit {
			return ActionStop
		}
		if f.Match(l) {
			out = append(out, l)
		}
		return ActionKeep
	})
	return out, err
}

// ListMore is List that also reports whether f.Limit left out dead letters
// that f selects: more is true when at least one more is there. It reads
// at most one dead letter past the limit.
func ListMore(ctx context.Context, b Broker, f Filter) (letters []*Letter, more bool, err error) {
	g := f
	if f.Limit > 0 {
		g.Limit = f.Limit + 1
	}
	letters, err = List(ctx, b, g)
	if f.Limit > 0 && len(letters) > f.Limit {
		letters, more = letters[:f.Limit], true
	}
	return letters, more, err
}

// Options tune Replay and Purge.
type Options struct {
	// DryRun selects as the command would, and returns the selection in
	// Result.Letters, but changes nothing. Defaults to false.
	DryRun bool
	// Failures, when set, has the failure count of each replayed key
	// forgotten (ForgetFailures in Scope) before its copy is sent, so that
	// the replay starts with a fresh count even where the runner could not
	// forget it after the dead letter: the driver of the runner's store,
	// like pgdedup.Store.Driver() (a dedupdriver.Common). Defaults to nil:
	// the runner's own forgetting (after every successful dead letter) is
	// relied on.
	Failures interface {
		ForgetFailures(ctx context.Context, scope, key string) error
	}
	// Scope is the runner's Config.Name, the scope of Failures' counts.
	Scope string
	// Progress, when set, is called after each dead letter replayed or
	// purged with the number done so far. Defaults to nil.
	Progress func(done int)
}

// Result is what Replay or Purge did.
type Result struct {
	// Letters are the dead letters selected, in the store's order. Without DryRun,
	// the first Done of them were replayed or purged.
	Letters []*Letter
	// Done is the number of dead letters replayed or purged (0 with
	// DryRun).
	Done int
}

// Replay sends the dead letters that f selects back to their origin, each
// removed from the dead-letter store only after its origin confirmed the
// copy (see Broker.Scan). It is at least once: run again after an
// interruption, it goes on with what is left, and a copy sent twice is
// absorbed by the runner's processed-message record. A dead letter without
// an origin is kept and reported (ErrNoOrigin) after the others were
// replayed.
func Replay(ctx context.Context, b Broker, f Filter, o Options) (Result, error) {
	return apply(ctx, b, f, o, ActionReplay)
}

// Purge removes the dead letters that f selects from the dead-letter store.
func Purge(ctx context.Context, b Broker, f Filter, o Options) (Result, error) {
	return apply(ctx, b, f, o, ActionPurge)
}

func apply(ctx context.Context, b Broker, f Filter, o Options, act Action) (Result, error) {
	if err := f.Validate(); err != nil {
		return Result{}, err
	}
	var res Result
	var noOrigin int
	var forgetErr error
	done, err := b.Scan(ctx, func(l *Letter) Action {
		if f.Limit > 0 && len(res.Letters) >= f.Limit {
			return ActionStop
		}
		if !f.Match(l) {
			return ActionKeep
		}
		if act == ActionReplay && l.Origin == "" {
			noOrigin++
			return ActionKeep
		}
		res.Letters = append(res.Letters, l)
		if o.DryRun {
			return ActionKeep
		}
		if act == ActionReplay && o.Failures != nil && l.Key != "" {
			if err := o.Failures.ForgetFailures(ctx, o.Scope, l.Key); err != nil {
				forgetErr = fmt.Errorf("dlq: forget the failure count of key %q: %w", l.Key, err)
				return ActionStop
			}
		}
		if o.Progress != nil && len(res.Letters) > 1 {
			o.Progress(len(res.Letters) - 1)
		}
		return act
	})
	res.Done = done
	if o.Progress != nil && done > 0 {
		o.Progress(done)
	}
	if o.DryRun {
		res.Done = 0
	}
	switch {
	case forgetErr != nil:
		return res, errors.Join(forgetErr, err)
	case err != nil:
		return res, err
	case noOrigin > 0:
		return res, fmt.Errorf("%w: %d selected dead letters kept", ErrNoOrigin, noOrigin)
	}
	return res, nil
}

// DigestID returns the ID of a dead letter that its store names no other
// way: "h-" and the first 16 hexadecimal digits of the SHA-256 of parts
// (each preceded by its length). It is the same at every scan for the same
// parts; a broker passes what does not change while the dead letter waits
// (its headers and body).
func DigestID(parts ...[]byte) string {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return "h-" + hex.EncodeToString(h.Sum(nil)[:8])
}

// Preview returns the first PreviewBytes bytes of body and its length.
func Preview(body []byte) ([]byte, int) {
	return body[:min(len(body), PreviewBytes)], len(body)
}
