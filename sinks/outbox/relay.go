package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/cfgerr"
)

// Errors of the relay and its publishers.
var (
	// ErrUnavailable marks a publish error caused by the broker or the
	// connection to it rather than by the message (connection refused, a
	// closed connection, a timeout). A Publisher wraps such errors with it:
	// the relay backs off and retries without counting an attempt, so an
	// outage never parks a row.
	ErrUnavailable = errors.New("outbox: broker unavailable")
	// ErrNoDestination marks a publish that failed because its destination
	// (topic, queue, exchange) does not exist or routes nowhere. It counts
	// as an attempt.
	ErrNoDestination = errors.New("outbox: destination does not exist")
)

// Log attribute keys of the relay and the Resender, besides the Runner's
// (consumer.LogKey*: the error is consumer.LogKeyError, "err").
const (
	// logKeyDestination is a row's destination, and its routing key after
	// a "/" when it has one (see destinationName).
	logKeyDestination = "destination"
	// logKeyParked counts parked rows.
	logKeyParked  = "parked"
	logKeyReplyID = "reply_id"
	logKeyReplyTo = "reply_to"
)

// Publisher sends messages to a broker. Implementations: kafkaoutbox,
// sqsoutbox, amqpoutbox.
type Publisher interface {
	// Publish sends msgs and returns once the broker confirmed every one of
	// them (nil), or with the errors. Messages of one Key appear in msgs in
	// publish order; msgs[i].ID is the stable id to send as the idempotency
	// key.
	//
	// A *BatchError gives each message's own outcome. Any other error
	// applies to every message. An error that wraps ErrUnavailable is an
	// outage and counts no attempt; any other error counts one attempt for
	// the message. A message is marked sent only when its error is nil, so
	// a Publisher must never report success without the broker's
	// confirmation.
	Publish(ctx context.Context, msgs []Message) error
}

// BatchError is a Publisher's outcome per message: Errs[i] is the error of
// msgs[i], nil when the broker confirmed it.
type BatchError struct {
	Errs []error
}

// Error summarises the failures.
func (e *BatchError) Error() string {
	n := 0
	for _, err := range e.Errs {
		if err != nil {
			n++
		}
	}
	return fmt.Sprintf("outbox: %d of %d messages failed, first: %v", n, len(e.Errs), cmp.Or(e.Errs...))
}

// BatchResult is what a Publisher returns for errs, the outcomes of its
// messages: nil when every one is nil, else a *BatchError of errs.
func BatchResult(errs []error) error {
	if cmp.Or(errs...) == nil {
		return nil
	}
	return &BatchError{Errs: errs}
}

// errAt returns the error of message i under the Publisher contract.
func errAt(err error, i int) error {
	var be *BatchError
	if errors.As(err, &be) && i < len(be.Errs) {
		return be.Errs[i]
	}
	return err
}

// Config configures a Relay. The zero value is usable.
type Config struct {
	// BatchSize is the largest number of rows claimed and published at
	// once. Defaults to 100.
	BatchSize int
	// Concurrency is the number of claim loops of a relay, each claiming
	// and publishing its batches in a transaction of its own, in parallel
	// (PostgreSQL only: SQLite relays take 1; NewRelay says what
	// connections they use). The rows of one key still go out one at a
	// time, in order. Defaults to 1.
	Concurrency int
	// PollInterval is how often the relay looks for rows without a
	// notification (the only wake-up on SQLite, the fallback on
	// PostgreSQL). Defaults to 1 s.
	PollInterval time.Duration
	// MaxAttempts is the number of failed publishes after which a row is
	// parked (state "parked", with its last error) instead of retried. An
	// outage (ErrUnavailable) is not an attempt. Defaults to 10.
	MaxAttempts int
	// InitialBackoff is the delay before a failed row's second attempt and the
	// first pause after an outage; both double up to MaxBackoff. Defaults to
	// 100 ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the delays. Defaults to 30 s.
	MaxBackoff time.Duration
	// Retention is how long sent rows stay in the table (for inspection)
	// before the cleanup loop deletes them. Negative deletes a row as soon
	// as it is sent. Defaults to 24 h.
	Retention time.Duration
	// CleanupInterval is how often the cleanup loop runs. Defaults to 1 min.
	CleanupInterval time.Duration
	// Partitioned says that the PostgreSQL table is partitioned by day of
	// created_at (docs/outbox.md): the cleanup loop then runs whatever the
	// Retention, creates partitions ahead and drops those holding no
	// pending, parked or retained row, instead of deleting rows. On a table
	// not yet partitioned it deletes rows as before. Ignored on SQLite.
	// Defaults to false.
	Partitioned bool
	// FailureReminder is the least time between two log lines about the
	// failed publishes of one destination (a topic, queue or exchange that
	// does not exist, a message the broker returns or refuses): its first
	// failure is logged at once (WARN, with the row, its attempt, when it
	// is tried again and the error), and later ones at most once per
	// FailureReminder, with the number left out since. Parked rows are
	// logged the same way at ERROR. Defaults to 1 min.
	FailureReminder time.Duration
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Hooks observe the relay (see Hook): for example
	// consumer/otelidemq's RelayHook for metrics. Defaults to none.
	Hooks []Hook
	// Schema is the PostgreSQL schema of the outbox table, as given to
	// Schema.Publish and dedup/migrate's Config.Schema. Defaults to "": the table is
	// found through the pool's search_path. SQLite relays refuse one.
	Schema Schema
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, 100)
	c.Concurrency = cmp.Or(c.Concurrency, 1)
	c.PollInterval = cmp.Or(c.PollInterval, time.Second)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 10)
	c.InitialBackoff = cmp.Or(c.InitialBackoff, 100*time.Millisecond)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, 30*time.Second)
	c.Retention = cmp.Or(c.Retention, 24*time.Hour)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, time.Minute)
	c.FailureReminder = cmp.Or(c.FailureReminder, time.Minute)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// validate reports every invalid field of c; nil arguments of the
// constructor (named by args) come first.
func (c Config) validate(args ...*idemq.ConfigError) error {
	var l cfgerr.List
	for _, a := range args {
		if a != nil {
			l.Include(a)
		}
	}
	l.Prefix = "outbox.Config."
	l.Positive("BatchSize", c.BatchSize)
	l.Positive("Concurrency", c.Concurrency)
	l.NotNegative("PollInterval", c.PollInterval)
	if l.NotNegative("InitialBackoff", c.InitialBackoff) && c.MaxBackoff < c.InitialBackoff {
		l.Add("MaxBackoff", "smaller than InitialBackoff")
	}
	l.NotNegative("CleanupInterval", c.CleanupInterval)
	l.Positive("MaxAttempts", c.MaxAttempts)
	l.NotNegative("FailureReminder", c.FailureReminder)
	return l.Err()
}

// invalid returns the error of field for reason when bad, else nil.
func invalid(bad bool, field, reason string) *idemq.ConfigError {
	if !bad {
		return nil
	}
	return &idemq.ConfigError{Field: field, Reason: reason}
}

// Row states.
const (
	statePending = 0
	stateSent    = 1
	stateParked  = 2
)

// row is a claimed outbox row.
type row struct {
	seq      int64
	attempts int
	msg      Message
}

// failure is a failed publish of one row.
type failure struct {
	seq       int64
	park      bool
	err       string
	nextRetry time.Duration
}

// claim holds the rows of a claimed batch until finish or abort.
type claim interface {
	// finish marks sent rows sent (or deletes them) and records failures.
	finish(ctx context.Context, sent []int64, failed []failure, deleteSent bool) error
	// abort gives the rows back untouched.
	abort(ctx context.Context)
}

// store is the relay's view of one database.
type store interface {
	// claimBatch claims up to n eligible rows: pending, due, and the oldest
	// pending row of their partition key.
	claimBatch(ctx context.Context, n int) ([]row, claim, error)
	// wait returns when rows may have been inserted or after d.
	wait(ctx context.Context, d time.Duration) error
	// cleanup deletes up to n rows sent more than retention ago (or drops
	// partitions) and returns how many.
	cleanup(ctx context.Context, retention time.Duration, n int) (int64, error)
	// counts returns the number of rows per state.
	counts(ctx context.Context) (Counts, error)
	// failures returns up to n groups of failed rows (failuresSQL).
	failures(ctx context.Context, n int) ([]FailureGroup, error)
	// parked returns up to n parked rows (all with n 0), of ids only when
	// ids is not empty, in seq order.
	parked(ctx context.Context, ids []string, n int) ([]ParkedRow, error)
	// unpark makes the parked rows of ids (all with no ids) pending with
	// no attempt, and returns how many.
	unpark(ctx context.Context, ids []string) (int64, error)
	close()
}

// FailureGroup counts the unsent rows of one destination whose last
// publish failed with one error (Relay.Failures).
type FailureGroup struct {
	// Destination and RoutingKey are the rows' (see Message).
	Destination, RoutingKey string
	// Error is the rows' last error.
	Error string
	// Failing rows are pending and wait for their next attempt; Parked
	// rows wait for Unpark.
	Failing, Parked int64
	// LastID is the id of the group's newest row.
	LastID string
}

// ParkedRow is a parked row (Relay.Parked).
type ParkedRow struct {
	ID, Destination, RoutingKey string
	// Key is the row's partition key (Message.Key).
	Key string
	// Attempts is the number of failed publishes; LastError the last one's
	// error.
	Attempts  int
	LastError string
	// Created is when the row was written.
	Created time.Time
}

// failuresSQL groups the unsent rows whose last publish failed (pending
// with attempts counted, or parked) by destination and last error, the
// largest groups first, in both dialects.
func failuresSQL(table string) string {
	return `SELECT g.destination, g.routing_key, g.last_error, g.failing, g.parked, o.id
FROM (SELECT destination, routing_key, last_error,
        sum(CASE WHEN state = 0 THEN 1 ELSE 0 END) AS failing,
        sum(CASE WHEN state = 2 THEN 1 ELSE 0 END) AS parked,
        max(seq) AS last_seq
      FROM ` + table + `
      WHERE last_error IS NOT NULL AND (state = 2 OR (state = 0 AND attempts > 0))
      GROUP BY destination, routing_key, last_error) g
JOIN ` + table + ` o ON o.seq = g.last_seq
ORDER BY g.failing + g.parked DESC, g.last_seq DESC
LIMIT $1`
}

// Counts are the numbers of outbox rows per state.
type Counts struct {
	// Pending rows wait to be published (including rows waiting for a retry).
	Pending int64
	// Sent rows were confirmed by the broker and wait for the cleanup.
	Sent int64
	// Failing rows are the pending rows whose last publish failed (an
	// attempt counted): they wait for their next attempt, and the later
	// rows of their key wait for them.
	Failing int64
	// Parked rows failed MaxAttempts times; their last error is in
	// last_error. Relay.Unpark (idemq relay unpark) puts them back.
	Parked int64
	// OldestPending is the age of the oldest pending row (0 without one).
	OldestPending time.Duration
	// OldestParked is the age of the oldest parked row (0 without one).
	OldestParked time.Duration
}

// Relay publishes committed outbox rows through a Publisher.
//
// A Relay claims up to BatchSize rows that are pending and due, and of each
// partition key only the oldest pending row, so the rows of one key are
// published one at a time, in the order they were inserted (by seq; rows
// inserted by transactions that commit out of seq order are published in
// commit order if the older one was not visible yet). A row is marked sent
// (or deleted, with a negative Retention) only after the Publisher reports
// the broker's confirmation; a relay that dies in between leaves it
// pending, and the next relay publishes it again with the same stable id,
// which downstream idemq consumers absorb.
//
// On PostgreSQL several relays (and the claim loops of one relay, see
// Config.Concurrency) can run at once: a claim locks its rows with
// FOR UPDATE SKIP LOCKED until the batch is recorded, and a key whose
// oldest row is locked has no eligible row for the others. Relays wake on
// LISTEN/NOTIFY (a trigger notifies at each committed insert) and poll
// every PollInterval as a fallback. On SQLite run one relay per database;
// it polls.
//
// A failed publish counts an attempt for the row and retries it after an
// exponential backoff while the later rows of its key wait. After
// MaxAttempts the row is parked (state 2, with last_error) and its key
// moves on; Unpark puts it back. Failures are logged per destination (see
// Config.FailureReminder), and Counts and Failures report them. An outage
// (ErrUnavailable) counts nothing: the relay backs off and retries the
// batch, so no row is ever dropped.
type Relay struct {
	st       store
	pub      Publisher
	cfg      Config
	hooks    hooks
	failures *failureLog
	// overlap: the store's claims lock their rows, so a claim loop may
	// record one batch while it claims the next.
	overlap bool
}

// newRelay returns a relay over st; cfg has its defaults and is valid.
func newRelay(st store, pub Publisher, cfg Config, overlap bool) *Relay {
	r := &Relay{st: st, pub: pub, cfg: cfg, overlap: overlap, failures: newFailureLog(cfg.Logger, cfg.FailureReminder)}
	r.setHooks()
	return r
}

// Run publishes rows until ctx is cancelled, then returns nil. It runs
// Concurrency claim loops, one goroutine that waits for notifications (or
// PollInterval) and wakes idle loops, and the cleanup loop, which deletes
// sent rows older than Retention every CleanupInterval.
func (r *Relay) Run(ctx context.Context) error {
	defer r.st.close()
	wake := make([]chan struct{}, r.cfg.Concurrency) // one per claim loop
	for i := range wake {
		wake[i] = make(chan struct{}, 1)
	}
	var wg sync.WaitGroup
	wg.Go(func() { r.cleanupLoop(ctx) })
	wg.Go(func() {
		for ctx.Err() == nil {
			if err := r.st.wait(ctx, r.cfg.PollInterval); err != nil && ctx.Err() == nil {
				r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outbox relay: wait for notifications", slog.Any(consumer.LogKeyError, err))
				sleep(ctx, r.cfg.PollInterval)
			}
			r.failures.flush(ctx)
			for _, c := range wake {
				select {
				case c <- struct{}{}:
				default: // a wake-up is pending already
				}
			}
		}
	})
	for _, c := range wake {
		wg.Go(func() { r.claimLoop(ctx, c) })
	}
	wg.Wait()
	return nil
}

// claimLoop relays batches while there are rows, and waits for a wake-up
// (a notification or PollInterval) when there are none; a wake-up that
// came during a claim stays pending, so none is missed.
//
// On a store whose claims lock their rows (PostgreSQL), the outcome of a
// batch is recorded (update and commit) in the background while the loop
// claims and publishes the next batch: at most one batch of the loop is
// being recorded at a time. The next claim skips the rows of the batch
// being recorded (they are locked) and the later rows of their keys (their
// oldest row is still pending until the commit), so per-key order holds,
// and rows are still marked only after the broker confirmed them.
func (r *Relay) claimLoop(ctx context.Context, wake <-chan struct{}) {
	var recording chan error // the outcome of the batch being recorded
	waitRecording := func() (bool, error) {
		if recording == nil {
			return false, nil
		}
		err := <-recording
		recording = nil
		return true, err
	}
	defer func() {
		// Run returns only after the last batch is recorded; a failure to
		// record it leaves its rows pending, to be published again.
		if _, err := waitRecording(); err != nil {
			r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outbox relay: record publish", slog.Any(consumer.LogKeyError, err))
		}
	}()
	outage := time.Duration(0)
	for ctx.Err() == nil {
		n, record, err := r.publishBatch(ctx)
		recorded, rerr := waitRecording()
		switch {
		case record == nil:
		case err == nil && rerr == nil && r.overlap:
			recording = make(chan error, 1)
			go func() { recording <- record() }()
		default:
			if e := record(); err == nil {
				err = e
			}
		}
		if err == nil {
			err = rerr
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			outage = min(max(2*outage, r.cfg.InitialBackoff), r.cfg.MaxBackoff)
			r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outbox relay: publish failed, backing off",
				slog.Duration(consumer.LogKeyDelay, outage), slog.Any(consumer.LogKeyError, err))
			sleep(ctx, jitter(outage))
			continue
		}
		outage = 0
		if n > 0 || recorded {
			continue // more rows may be waiting, or be eligible now that the previous batch is recorded
		}
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// RelayOnce claims one batch, publishes it and records the outcome. It
// returns the number of rows claimed, and an error when the batch could not
// be claimed or recorded, or the broker is unavailable (ErrUnavailable);
// rows of such a batch stay pending, with no attempt counted.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	n, record, err := r.publishBatch(ctx)
	if record != nil {
		if rerr := record(); rerr != nil {
			err = rerr
		}
	}
	return n, err
}

// publishBatch claims one batch and publishes it. It returns the number of
// rows claimed; record, when not nil, records the outcome and must be
// called (once) whatever the error; err is the claim's or the publish's
// error (a failure of record is record's).
func (r *Relay) publishBatch(ctx context.Context) (n int, record func() error, err error) {
	rows, c, err := r.st.claimBatch(ctx, r.cfg.BatchSize)
	if err != nil {
		return 0, nil, fmt.Errorf("outbox: claim: %w", err)
	}
	if len(rows) == 0 {
		c.abort(ctx)
		return 0, nil, nil
	}
	msgs := make([]Message, len(rows))
	for i, row := range rows {
		msgs[i] = row.msg
	}
	start := time.Now()
	perr := r.pub.Publish(ctx, msgs)
	took := time.Since(start)
	sent := make([]int64, 0, len(rows))
	var failed []failure
	parked := 0
	var unavailable error
	for i, row := range rows {
		err := errAt(perr, i)
		switch {
		case err == nil:
			sent = append(sent, row.seq)
		case errors.Is(err, ErrUnavailable) || ctx.Err() != nil:
			unavailable = cmp.Or(unavailable, err)
		default:
			attempts := row.attempts + 1
			f := failure{seq: row.seq, err: err.Error(), park: attempts >= r.cfg.MaxAttempts, nextRetry: r.backoff(attempts)}
			r.failures.failed(ctx, row.msg, attempts, f.err, f.park, f.nextRetry)
			failed = append(failed, f)
			if f.park {
				parked++
			}
		}
	}
	if len(r.hooks.send) > 0 {
		ids, dests, headers := make([]string, len(msgs)), make([]string, len(msgs)), make([]map[string]string, len(msgs))
		for i, m := range msgs {
			ids[i], dests[i], headers[i] = m.ID, m.Destination, m.Headers
		}
		for _, h := range r.hooks.send {
			h.OnRelaySend(ctx, ids, dests, headers, start, took, perr)
		}
	}
	for _, h := range r.hooks.publish {
		h.OnRelayPublish(ctx, len(rows), len(sent), parked, took, perr)
	}
	if unavailable != nil {
		err = fmt.Errorf("outbox: publish: %w", unavailable)
	}
	if len(sent) == 0 && len(failed) == 0 {
		c.abort(ctx)
		return len(rows), nil, err
	}
	// Record what the broker confirmed even when part of the batch hit an
	// outage: the rows of the outage stay pending with no attempt counted.
	return len(rows), func() error {
		// The broker confirmed: record it even if ctx is being cancelled,
		// so a shutting-down relay does not publish these rows again.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := c.finish(ctx, sent, failed, r.cfg.Retention < 0); err != nil {
			return fmt.Errorf("outbox: record publish: %w", err)
		}
		return nil
	}, err
}

// Counts returns the number of rows per state, for monitoring.
func (r *Relay) Counts(ctx context.Context) (Counts, error) {
	return r.st.counts(ctx)
}

// Failures returns up to n groups of the rows that are not sent and whose
// last publish failed (pending rows waiting for their next attempt, and
// parked rows), one per destination, routing key and last error, the
// largest first: what `idemq relay --stats` shows. It reads the table
// without locking it, so it is safe while relays run.
func (r *Relay) Failures(ctx context.Context, n int) ([]FailureGroup, error) {
	if n < 1 {
		return nil, nil
	}
	g, err := r.st.failures(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("outbox: failures: %w", err)
	}
	return g, nil
}

// Parked returns the parked rows among ids, or up to n parked rows when
// ids is empty (all of them with n 0), oldest first: what Unpark (with the
// same ids) or UnparkAll would put back.
func (r *Relay) Parked(ctx context.Context, ids []string, n int) ([]ParkedRow, error) {
	rows, err := r.st.parked(ctx, ids, n)
	if err != nil {
		return nil, fmt.Errorf("outbox: parked rows: %w", err)
	}
	return rows, nil
}

// Unpark puts the parked rows with the given ids back to pending with no
// attempt counted, so that the relays publish them again (each gets
// MaxAttempts new attempts; its last_error stays until the next failure).
// Ids that name no parked row are left alone; no ids unparks nothing. It
// returns the number of rows unparked. On PostgreSQL it wakes the relays
// (NOTIFY); on SQLite they find the rows at their next poll. It is safe
// while relays run.
//
// An unparked row is again the oldest pending row of its key, so the
// key's later pending rows wait for it; the rows of its key that were
// published while it was parked stay ahead of it.
func (r *Relay) Unpark(ctx context.Context, ids ...string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return r.unpark(ctx, ids)
}

// UnparkAll is Unpark for every parked row.
func (r *Relay) UnparkAll(ctx context.Context) (int64, error) {
	return r.unpark(ctx, nil)
}

func (r *Relay) unpark(ctx context.Context, ids []string) (int64, error) {
	n, err := r.st.unpark(ctx, ids)
	if err != nil {
		return n, fmt.Errorf("outbox: unpark: %w", err)
	}
	return n, nil
}

// backoff is the delay before the attempt after the attempts-th failure.
func (r *Relay) backoff(attempts int) time.Duration {
	d := r.cfg.InitialBackoff
	for i := 1; i < attempts && d < r.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, r.cfg.MaxBackoff)
}

func (r *Relay) cleanupLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.Cleanup(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outbox relay: cleanup", slog.Any(consumer.LogKeyError, err))
		}
	}
}

// Cleanup deletes the rows sent more than Retention ago, in batches of
// 1000 so that it never holds many locks, and returns how many it deleted.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	if r.cfg.Retention < 0 && !r.cfg.Partitioned {
		return 0, nil
	}
	var total int64
	for {
		n, err := r.st.cleanup(ctx, r.cfg.Retention, 1000)
		total += n
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup: %w", err)
		}
		if n < 1000 {
			return total, nil
		}
	}
}

func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
