package kafkasource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
)

// Log attribute keys used by the source, beside consumer's LogKey constants.
const (
	LogKeyGroup      = "group"
	LogKeyPartition  = "partition"
	LogKeyOffset     = "offset"
	LogKeyGeneration = "generation"
	LogKeyComponent  = "component"
)

var (
	// ErrForeignMessage reports a consumer.Message that this Source did not
	// produce.
	ErrForeignMessage = errors.New("kafkasource: message was not received from this source")

	// ErrFinalCommit reports that the offset commit Close sends failed. The
	// settled messages since the last successful commit are redelivered to
	// the group, which deduplication absorbs.
	ErrFinalCommit = errors.New("kafkasource: final offset commit failed")

	// ErrSettled reports a Retry or DeadLetter of a message that was
	// already acknowledged or dead-lettered. Nothing is done.
	ErrSettled = errors.New("kafkasource: message already settled")
)

// Source is a consumer.Source over Kafka topics, read by a consumer group
// with kafka-go's Reader (FetchMessage, and CommitMessages queued to the
// reader's periodic commit loop).
//
// It commits, for each partition, only the contiguous prefix of fetched
// messages that were acknowledged or dead-lettered, and only while the
// newest of them was fetched in the group generation that is current; see
// the package documentation for the exact guarantees and the duplicate
// window. Create one with New; it is safe for concurrent use, as
// consumer.Source requires.
type Source struct {
	cfg       Config
	log       *slog.Logger
	reader    *kafka.Reader
	dlq       *kafka.Writer
	transport *kafka.Transport

	// slots holds one token per message fetched, not yet settled and not
	// held behind a retried message of its key (Config.MaxInFlight).
	slots chan struct{}
	// retained holds one token per message fetched and not yet passed by
	// its partition's settled prefix (Config.MaxUncommitted).
	retained chan struct{}
	// ready holds messages to hand out. Its capacity is MaxUncommitted and
	// every unsettled message is retained and in it at most once, so sends
	// never block.
	ready chan *consumer.Message
	// errs carries the latest fetch error to Receive.
	errs chan error

	fetchCancel context.CancelFunc
	fetchDone   chan struct{}
	closing     chan struct{}
	closeOnce   sync.Once
	closeErr    error

	// genMu serialises reads of the reader's rebalance counter, which
	// kafka-go resets on every read; gen accumulates it.
	genMu sync.Mutex
	gen   atomic.Int64

	mu         sync.Mutex // guards everything below
	closed     bool
	inFlight   int // admitted and not settled
	partitions map[topicPartition]*partition
	dirty      map[*partition]struct{}
	holds      map[string]*hold
	timers     map[*entry]*time.Timer

	stats *counters
}

var _ consumer.Source = (*Source)(nil)

type topicPartition struct {
	topic     string
	partition int
}

// partition is the commit queue of one topic partition.
type partition struct {
	topicPartition
	// queue holds the fetched entries not yet passed by the settled
	// prefix, in fetch order.
	queue []*entry
	// doneUpTo is the highest offset passed by the settled prefix (-1:
	// none). Every message at or below it is durable (see doc.go).
	doneUpTo int64
	// doneGen is the generation tag of the newest entry passed.
	doneGen int64
	// committed is the next offset this source committed (0: none).
	committed int64
	// fetchGen is the generation tag of the newest entry fetched.
	fetchGen int64
}

// hold keeps later messages of one key back while an earlier one waits for
// a retry, so that retries do not reorder a key.
type hold struct {
	// blockers counts the handed-out, unsettled messages of the key that
	// the later ones wait for.
	blockers int
	// queue holds the later messages, in fetch order.
	queue []*entry
	// waiting holds the messages of the key whose redelivery timer runs.
	waiting []*entry
}

// entry is one fetched message. It is consumer.Message.Handle.
type entry struct {
	src          *Source
	part         *partition
	km           kafka.Message
	offset       int64
	gen          int64
	id           string
	key          string
	keyErr       error // Config.KeyOf panicked
	partitionKey string
	holdKey      string

	// Guarded by Source.mu.
	settled  bool
	blocker  bool
	slot     bool // holds a token of Source.slots
	timerSeq uint64
	// due and attempt describe the pending redelivery, if any.
	due     time.Time
	attempt int
	// deadLetterFailures counts the consecutive failed dead-letter writes.
	deadLetterFailures int
}

// New returns a Source for cfg and starts joining its consumer group and
// fetching in the background. It validates cfg (after WithDefaults) and
// returns a *ConfigError for each invalid field, all at once. Unless
// cfg.ConnectTimeout is negative, it then checks that a broker answers,
// within ctx and ConnectTimeout, and returns ErrUnreachable if none does;
// it does not wait for the group. ctx bounds that check only: the Source
// runs until Close.
func New(ctx context.Context, cfg Config) (src *Source, err error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	stats := new(counters)
	rc := kafka.ReaderConfig{
		Brokers:           cfg.Brokers,
		GroupID:           cfg.GroupID,
		Dialer:            cfg.Dialer,
		QueueCapacity:     cfg.QueueCapacity,
		MinBytes:          cfg.MinBytes,
		MaxBytes:          cfg.MaxBytes,
		MaxWait:           cfg.MaxWait,
		ReadLagInterval:   -1,
		HeartbeatInterval: cfg.HeartbeatInterval,
		CommitInterval:    cfg.CommitInterval, // kafka-go's commit loop; see commit.go
		SessionTimeout:    cfg.SessionTimeout,
		RebalanceTimeout:  cfg.RebalanceTimeout,
		JoinGroupBackoff:  cfg.JoinGroupBackoff,
		StartOffset:       cfg.StartOffset,
		IsolationLevel:    cfg.IsolationLevel,
		Logger:            readerLogger(cfg.Logger, stats),
		ErrorLogger:       readerErrorLogger(cfg.Logger, stats),
	}
	if len(cfg.Topics) == 1 {
		rc.Topic = cfg.Topics[0]
	} else {
		rc.GroupTopics = cfg.Topics
	}
	if err := rc.Validate(); err != nil {
		return nil, &ConfigError{Field: "kafkasource.Config", Reason: "rejected by kafka-go", Err: err}
	}
	if cfg.ConnectTimeout >= 0 {
		pctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
		err := ping(pctx, cfg)
		cancel()
		if err != nil {
			return nil, err
		}
	}

	// kafka.NewReader panics on configurations it rejects; report them.
	defer func() {
		if v := recover(); v != nil {
			src, err = nil, &ConfigError{Field: "kafkasource.Config", Reason: fmt.Sprint(v)}
		}
	}()
	reader := kafka.NewReader(rc)

	transport := transportFor(cfg.Dialer)
	s := &Source{
		cfg:       cfg,
		log:       cfg.Logger.With(LogKeyGroup, cfg.GroupID),
		reader:    reader,
		transport: transport,
		dlq: &kafka.Writer{
			Addr:         kafka.TCP(cfg.Brokers...),
			Balancer:     &kafka.Hash{},
			RequiredAcks: kafka.RequireAll,
			BatchTimeout: time.Millisecond,
			Transport:    transport,
			Logger:       kafkaLogger(cfg.Logger, slog.LevelDebug),
			ErrorLogger:  kafkaLogger(cfg.Logger, slog.LevelWarn),
		},
		slots:      make(chan struct{}, cfg.MaxInFlight),
		retained:   make(chan struct{}, cfg.MaxUncommitted),
		ready:      make(chan *consumer.Message, cfg.MaxUncommitted),
		errs:       make(chan error, 1),
		fetchDone:  make(chan struct{}),
		closing:    make(chan struct{}),
		partitions: make(map[topicPartition]*partition),
		dirty:      make(map[*partition]struct{}),
		holds:      make(map[string]*hold),
		timers:     make(map[*entry]*time.Timer),
		stats:      stats,
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.fetchCancel = cancel
	go s.fetchLoop(ctx)
	return s, nil
}

// Config returns the source's configuration with defaults applied.
func (s *Source) Config() Config { return s.cfg }

// Receive blocks until at least one message is available, then returns up to
// limit of them (at least one). It returns ctx.Err() when ctx is done,
// consumer.ErrClosed after Close, and the latest fetch error (a broker or
// group failure, which the Runner retries with backoff) when one occurred
// since the last call and no message is ready. Receive commits nothing.
func (s *Source) Receive(ctx context.Context, limit int) ([]*consumer.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case <-s.closing:
		return nil, consumer.ErrClosed
	default:
	}
	limit = max(limit, 1)
	// Messages first: a fetch error of one partition must not hold up the
	// messages of the others.
	select {
	case m := <-s.ready:
		return s.drain(m, limit), nil
	default:
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.closing:
		return nil, consumer.ErrClosed
	case m := <-s.ready:
		return s.drain(m, limit), nil
	case err := <-s.errs:
		return nil, err
	}
}

// drain returns first and up to limit-1 more ready messages, without
// blocking.
func (s *Source) drain(first *consumer.Message, limit int) []*consumer.Message {
	out := make([]*consumer.Message, 1, min(limit, 1+len(s.ready)))
	out[0] = first
	for len(out) < limit {
		select {
		case m := <-s.ready:
			out = append(out, m)
		default:
			return out
		}
	}
	return out
}

// Ack marks msgs settled and requests, for every partition they belong to, the
// commit of the offset after the longest prefix of fetched messages that are
// all settled. It does not wait for the broker: the offsets are committed
// within Config.CommitInterval, when the group rebalances, or on Close,
// whichever comes first (see the package documentation for the redelivery
// window this leaves). A message behind an unsettled one is committed later,
// with the commit that passes it; until then a crash or rebalance redelivers
// it, which deduplication absorbs. Ack requests nothing for a partition whose
// newest settled message was fetched before the group's latest rebalance.
//
// An error means the request was not queued (or the source is closed); it is
// harmless, because the settled offsets are carried by the next request, and
// a redelivery in between is recognised as a duplicate.
func (s *Source) Ack(ctx context.Context, msgs []*consumer.Message) error {
	var errs []error
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return consumer.ErrClosed
	}
	for _, m := range msgs {
		e, err := s.entryOf(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.settleLocked(e)
	}
	s.mu.Unlock()
	if err := s.requestCommit(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Retry hands msg out again after delay with Attempt increased. Kafka has no
// negative acknowledgement, so the retry happens in this process: the
// message's offset stays uncommitted meanwhile, which keeps the commit of its
// partition from passing it, and if the process stops first the group
// redelivers it from the committed offset. Later messages with the same
// PartitionKey in the same partition that were fetched after the failure
// wait until msg is settled, so retries keep their order.
func (s *Source) Retry(_ context.Context, msg *consumer.Message, delay time.Duration) error {
	return s.redeliver(msg, msg.Attempt+1, delay)
}

// Release implements consumer.Releaser: it hands msg out again after delay,
// like Retry, with the same Attempt. The runner uses it when the message was
// not at fault (a database outage, a batch-mate's failure), so that such
// retries do not use up the message's attempts.
func (s *Source) Release(_ context.Context, msg *consumer.Message, delay time.Duration) error {
	return s.redeliver(msg, msg.Attempt, delay)
}

var _ consumer.Releaser = (*Source)(nil)

func (s *Source) redeliver(msg *consumer.Message, attempt int, delay time.Duration) error {
	e, err := s.entryOf(msg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return consumer.ErrClosed
	case e.settled:
		return fmt.Errorf("kafkasource: retry of %s: %w", msg.ID, ErrSettled)
	}
	s.blockLocked(e)
	s.redeliverLocked(e, attempt, delay)
	return nil
}

// DeadLetter writes a copy of msg to the dead-letter topic
// (Config.DeadLetterTopic, by default "<topic>.dlq") with the original key, value and
// headers plus HeaderReason, HeaderAttempts, HeaderOriginTopic,
// HeaderOriginPartition, HeaderOriginOffset, HeaderGroup, HeaderKey and
// HeaderDeadLetteredAt, waits until every in-sync replica has it, and only
// then settles msg and requests its commit as Ack does.
//
// HeaderReason is cut to MaxReasonBytes.
//
// If the write fails, the error is returned and msg stays uncommitted and is
// handed out again after Config.DeadLetterRetryDelay (the runner will route
// it again), so nothing is lost; but its partition's commit cannot pass it
// until a write succeeds, and a write that never succeeds (a missing topic,
// a denied ACL, a copy too large) blocks that commit for good and stops
// fetching once Config.MaxUncommitted messages are retained. From the
// DeadLetterStuckAfter-th consecutive failure on, each failure is logged at
// Error level; Stats.DeadLetterStuck counts such messages. A commit failure after a successful write is
// only logged: the copy is durable, and a redelivery would write a second
// copy with the same origin headers.
func (s *Source) DeadLetter(ctx context.Context, msg *consumer.Message, reason error) error {
	e, err := s.entryOf(msg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return consumer.ErrClosed
	case e.settled:
		s.mu.Unlock()
		return fmt.Errorf("kafkasource: dead-letter of %s: %w", msg.ID, ErrSettled)
	}
	km := e.km
	s.mu.Unlock()

	dead := s.deadLetterCopy(km, msg, reason)
	wctx, cancel := context.WithTimeout(ctx, s.cfg.DeadLetterTimeout)
	err = s.dlq.WriteMessages(wctx, dead)
	cancel()
	if err != nil {
		s.stats.deadLetterFailures.Add(1)
		s.mu.Lock()
		failures := 0
		if !s.closed && !e.settled {
			e.deadLetterFailures++
			failures = e.deadLetterFailures
			s.blockLocked(e)
			s.redeliverLocked(e, msg.Attempt, s.cfg.DeadLetterRetryDelay)
		}
		s.mu.Unlock()
		level := slog.LevelWarn
		if failures >= DeadLetterStuckAfter {
			level = slog.LevelError
			if failures == DeadLetterStuckAfter {
				s.stats.deadLetterStuck.Add(1)
			}
		}
		s.log.Log(ctx, level, "dead-letter write failed; the message blocks its partition's commit until a write succeeds",
			consumer.LogKeyID, msg.ID, consumer.LogKeyTopic, dead.Topic, consumer.LogKeyCount, failures,
			consumer.LogKeyError, err)
		return fmt.Errorf("kafkasource: dead-letter %s to topic %q (handed out again in %s): %w",
			msg.ID, dead.Topic, s.cfg.DeadLetterRetryDelay, err)
	}
	s.stats.deadLettered.Add(1)

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil // durable copy; the uncommitted original comes back and is copied again
	}
	s.settleLocked(e)
	s.mu.Unlock()
	if err := s.requestCommit(ctx); err != nil {
		s.log.WarnContext(ctx, "offset commit request after dead-letter failed; a redelivery may be dead-lettered again",
			consumer.LogKeyID, msg.ID, consumer.LogKeyError, err)
	}
	return nil
}

// Close stops fetching, commits the settled prefixes (bounded by
// Config.CommitTimeout; a failure is returned), leaves the consumer group and
// closes the connections. Messages fetched and not settled, including those waiting for
// a retry, are not committed: the group hands them out again. Close is safe to
// call more than once and concurrently with the other methods, which then
// fail with consumer.ErrClosed; every call returns the first call's result.
func (s *Source) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Source) close() error {
	s.mu.Lock()
	s.closed = true
	close(s.closing)
	for e, t := range s.timers {
		t.Stop()
		delete(s.timers, e)
	}
	s.mu.Unlock()

	s.fetchCancel()
	<-s.fetchDone

	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CommitTimeout)
	defer cancel()
	if err := s.requestCommit(ctx); err != nil {
		errs = append(errs, err)
	}
	// Closing the reader ends its generation, and kafka-go's commit loop
	// sends the offsets requested since its last tick before it returns.
	failures := s.stats.commitFailures.Load()
	if err := s.reader.Close(); err != nil {
		errs = append(errs, fmt.Errorf("kafkasource: close reader: %w", err))
	}
	if s.stats.commitFailures.Load() != failures {
		errs = append(errs, ErrFinalCommit)
	}
	if err := s.dlq.Close(); err != nil {
		errs = append(errs, fmt.Errorf("kafkasource: close dead-letter writer: %w", err))
	}
	s.transport.CloseIdleConnections()
	return errors.Join(errs...)
}

// fetchLoop fetches messages while fewer than MaxUncommitted are retained and
// fewer than MaxInFlight are unsettled and not held, until ctx is cancelled.
func (s *Source) fetchLoop(ctx context.Context) {
	defer close(s.fetchDone)
	failures := 0
	for {
		select {
		case s.retained <- struct{}{}:
		case <-ctx.Done():
			return
		}
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		km, err := s.reader.FetchMessage(ctx)
		if err != nil {
			<-s.slots
			<-s.retained
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return
			}
			failures++
			err = fmt.Errorf("kafkasource: fetch: %w", err)
			s.log.WarnContext(ctx, "fetch failed", consumer.LogKeyError, err, consumer.LogKeyAttempt, failures)
			select {
			case s.errs <- err:
			default: // an earlier error is still waiting to be reported
			}
			sleep(ctx, fetchBackoff(failures))
			continue
		}
		failures = 0
		s.admit(km, s.observeGeneration(ctx))
	}
}

// admit records a fetched message in its partition's commit queue and hands
// it out, or holds it behind a retried message of the same key.
func (s *Source) admit(km kafka.Message, gen int64) {
	e := &entry{
		src:    s,
		km:     km,
		offset: km.Offset,
		gen:    gen,
		id:     km.Topic + "/" + strconv.Itoa(km.Partition) + "/" + strconv.FormatInt(km.Offset, 10),
		slot:   true,
	}
	e.key, e.keyErr = s.keyOf(km)
	switch s.cfg.Ordering {
	case OrderByPartition:
		e.partitionKey = km.Topic + "/" + strconv.Itoa(km.Partition)
		e.holdKey = e.partitionKey
	default:
		if len(km.Key) > 0 {
			e.partitionKey = string(km.Key)
			e.holdKey = km.Topic + "/" + strconv.Itoa(km.Partition) + "/" + e.partitionKey
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	tp := topicPartition{km.Topic, km.Partition}
	p := s.partitions[tp]
	if p == nil {
		p = &partition{topicPartition: tp, doneUpTo: -1}
		s.partitions[tp] = p
	}
	e.part = p
	p.fetchGen = gen
	p.queue = append(p.queue, e)
	s.inFlight++
	s.stats.fetched.Add(1)
	if e.holdKey != "" {
		if h := s.holds[e.holdKey]; h != nil {
			// A held message gives its fetch slot back, so that one retried
			// message (with OrderByPartition: one retried partition) does
			// not stop the fetching of the others; MaxUncommitted still
			// bounds the held messages.
			h.queue = append(h.queue, e)
			<-s.slots
			e.slot = false
			return
		}
	}
	s.ready <- s.message(e, 1)
}

// keyOf returns the deduplication key the message carries, or "". A panic
// of Config.KeyOf is returned as an error, which the runner dead-letters
// the message with, instead of crashing the fetch loop.
func (s *Source) keyOf(km kafka.Message) (key string, err error) {
	if s.cfg.KeyOf != nil {
		defer func() {
			if v := recover(); v != nil {
				key, err = "", &consumer.PanicError{Value: v, Stack: debug.Stack()}
			}
		}()
		return s.cfg.KeyOf(km), nil
	}
	key = ""
	for _, h := range km.Headers {
		if h.Key == s.cfg.KeyHeader {
			key = string(h.Value) // the last one wins, as for Headers
		}
	}
	return key, nil
}

// message builds the consumer.Message of one delivery of e.
func (s *Source) message(e *entry, attempt int) *consumer.Message {
	headers := make(map[string]string, len(e.km.Headers))
	for _, h := range e.km.Headers {
		headers[h.Key] = string(h.Value)
	}
	return &consumer.Message{
		ID:           e.id,
		Key:          e.key,
		KeyErr:       e.keyErr,
		Body:         e.km.Value,
		Headers:      headers,
		PartitionKey: e.partitionKey,
		Topic:        e.km.Topic,
		Attempt:      attempt,
		Redelivered:  attempt > 1,
		ReceivedAt:   time.Now(),
		Raw:          e.km,
		Handle:       e,
	}
}

func (s *Source) entryOf(m *consumer.Message) (*entry, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil message", ErrForeignMessage)
	}
	e, ok := m.Handle.(*entry)
	if !ok || e.src != s {
		return nil, fmt.Errorf("%w: %s", ErrForeignMessage, m.ID)
	}
	return e, nil
}

// settleLocked marks e settled, frees its slot, releases messages held
// behind it and advances its partition's settled prefix.
func (s *Source) settleLocked(e *entry) {
	if e.settled {
		return
	}
	e.settled = true
	e.km = kafka.Message{} // the payload is no longer needed
	e.timerSeq++           // a pending redelivery is void
	if t := s.timers[e]; t != nil {
		t.Stop()
		delete(s.timers, e)
		s.unwaitLocked(e)
	}
	if e.slot {
		<-s.slots
		e.slot = false
	}
	s.inFlight--
	if e.blocker {
		s.unblockLocked(e)
	}
	p := e.part
	advanced := false
	for len(p.queue) > 0 && p.queue[0].settled {
		head := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		<-s.retained
		p.doneUpTo = max(p.doneUpTo, head.offset)
		p.doneGen = head.gen
		advanced = true
	}
	if advanced {
		s.dirty[p] = struct{}{}
	}
}

// blockLocked makes e a message that later messages of its key wait for.
func (s *Source) blockLocked(e *entry) {
	if e.holdKey == "" || e.blocker {
		return
	}
	h := s.holds[e.holdKey]
	if h == nil {
		h = &hold{}
		s.holds[e.holdKey] = h
	}
	h.blockers++
	e.blocker = true
}

// unblockLocked is called when blocker e is settled. When no blocker of its
// key is left, the messages held behind them are handed out together, and
// they become the blockers of the messages fetched after them.
func (s *Source) unblockLocked(e *entry) {
	e.blocker = false
	h := s.holds[e.holdKey]
	h.blockers--
	if h.blockers > 0 {
		return
	}
	if len(h.queue) == 0 {
		delete(s.holds, e.holdKey)
		return
	}
	released := h.queue
	h.queue = nil
	h.blockers = len(released)
	for _, q := range released {
		q.blocker = true
		s.ready <- s.message(q, 1)
	}
}

// redeliverLocked hands e out again as attempt after delay.
func (s *Source) redeliverLocked(e *entry, attempt int, delay time.Duration) {
	if t := s.timers[e]; t != nil {
		t.Stop()
	} else if h := s.holds[e.holdKey]; e.holdKey != "" && h != nil {
		h.waiting = append(h.waiting, e)
	}
	delay = max(delay, 0)
	e.timerSeq++
	e.due = time.Now().Add(delay)
	e.attempt = attempt
	seq := e.timerSeq
	s.stats.redelivered.Add(1)
	s.timers[e] = time.AfterFunc(delay, func() { s.redeliverDue(e, seq) })
}

// redeliverDue runs when e's redelivery timer fires. It hands e out together
// with every other due message of its key, in offset order: their timers race
// for s.mu, and a later message must not overtake an earlier one.
func (s *Source) redeliverDue(e *entry, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || e.settled || e.timerSeq != seq {
		return
	}
	due := []*entry{e}
	if h := s.holds[e.holdKey]; e.holdKey != "" && h != nil {
		now := time.Now()
		due = due[:0]
		kept := h.waiting[:0]
		for _, w := range h.waiting {
			if w == e || !w.due.After(now) {
				due = append(due, w)
			} else {
				kept = append(kept, w)
			}
		}
		clear(h.waiting[len(kept):])
		h.waiting = kept
		slices.SortFunc(due, func(a, b *entry) int { return cmp.Compare(a.offset, b.offset) })
	}
	for _, w := range due {
		if t := s.timers[w]; t != nil {
			t.Stop()
			delete(s.timers, w)
		}
		w.timerSeq++
		s.ready <- s.message(w, w.attempt)
	}
}

// unwaitLocked removes e from its key's messages waiting for a redelivery.
func (s *Source) unwaitLocked(e *entry) {
	h := s.holds[e.holdKey]
	if e.holdKey == "" || h == nil {
		return
	}
	if i := slices.Index(h.waiting, e); i >= 0 {
		h.waiting = slices.Delete(h.waiting, i, i+1)
	}
}

// observeGeneration returns the reader's rebalance count so far. kafka-go
// counts every consumer-group generation it joins, before it starts that
// generation's partition readers (so a message fetched after this count was
// read belongs to the generation counted or an older one), and also every
// time a partition reader loses its partition's leader. The count is
// therefore a conservative generation tag: it grows at least once per
// generation, and a growth without a rebalance only makes the fence skip
// commits that were safe. A growth is logged with ctx.
func (s *Source) observeGeneration(ctx context.Context) int64 {
	s.genMu.Lock()
	defer s.genMu.Unlock()
	if n := s.reader.Stats().Rebalances; n > 0 {
		g := s.gen.Add(n)
		s.log.InfoContext(ctx, "consumer group rebalanced or partition leader moved", LogKeyGeneration, g)
	}
	return s.gen.Load()
}

// deadLetterCopy builds the dead-letter message for km.
func (s *Source) deadLetterCopy(km kafka.Message, msg *consumer.Message, reason error) kafka.Message {
	attempts := msg.Attempt
	key := msg.Key
	var dl *consumer.DeadLetterError
	if errors.As(reason, &dl) {
		attempts = dl.Attempts
		if dl.Key != "" {
			key = dl.Key
		}
	}
	text := "unknown"
	if reason != nil {
		text = truncateReason(reason.Error())
	}
	headers := make([]kafka.Header, 0, len(km.Headers)+8)
	for _, h := range km.Headers {
		if !isDeadLetterHeader(h.Key) {
			headers = append(headers, h)
		}
	}
	headers = append(headers,
		kafka.Header{Key: HeaderReason, Value: []byte(text)},
		kafka.Header{Key: HeaderAttempts, Value: []byte(strconv.Itoa(attempts))},
		kafka.Header{Key: HeaderOriginTopic, Value: []byte(km.Topic)},
		kafka.Header{Key: HeaderOriginPartition, Value: []byte(strconv.Itoa(km.Partition))},
		kafka.Header{Key: HeaderOriginOffset, Value: []byte(strconv.FormatInt(km.Offset, 10))},
		kafka.Header{Key: HeaderGroup, Value: []byte(s.cfg.GroupID)},
		kafka.Header{Key: HeaderDeadLetteredAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	)
	if key != "" {
		headers = append(headers, kafka.Header{Key: HeaderKey, Value: []byte(key)})
	}
	return kafka.Message{
		Topic:   s.cfg.deadLetterTopic(km.Topic),
		Key:     km.Key,
		Value:   km.Value,
		Headers: headers,
	}
}

// MaxReasonBytes is the longest HeaderReason value written; a longer reason
// is cut at a UTF-8 boundary and ends with " ...(truncated)".
const MaxReasonBytes = 4096

func truncateReason(s string) string {
	if len(s) <= MaxReasonBytes {
		return s
	}
	const suffix = " ...(truncated)"
	cut := MaxReasonBytes - len(suffix)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + suffix
}

func isDeadLetterHeader(k string) bool {
	switch k {
	case HeaderReason, HeaderAttempts, HeaderOriginTopic, HeaderOriginPartition, HeaderOriginOffset,
		HeaderGroup, HeaderKey, HeaderDeadLetteredAt:
		return true
	}
	return false
}

// transportFor builds the dead-letter writer's transport from the dialer, so
// that TLS, SASL, the client id and the dial function apply to it too.
func transportFor(d *kafka.Dialer) *kafka.Transport {
	t := &kafka.Transport{
		ClientID:    d.ClientID,
		TLS:         d.TLS,
		SASL:        d.SASLMechanism,
		DialTimeout: d.Timeout,
	}
	if d.DialFunc != nil {
		t.Dial = d.DialFunc
	} else {
		nd := &net.Dialer{
			Timeout:       d.Timeout,
			Deadline:      d.Deadline,
			LocalAddr:     d.LocalAddr,
			FallbackDelay: d.FallbackDelay,
			KeepAlive:     d.KeepAlive,
		}
		t.Dial = nd.DialContext
	}
	return t
}

// kafkaLogger adapts l to kafka-go's Logger at level, or returns nil (no
// logging, no formatting cost) when l does not log at that level.
func kafkaLogger(l *slog.Logger, level slog.Level) kafka.Logger {
	if !l.Enabled(context.Background(), level) {
		return nil
	}
	return kafka.LoggerFunc(func(format string, args ...any) {
		l.Log(context.Background(), level, strings.TrimSpace(fmt.Sprintf(format, args...)), LogKeyComponent, "kafka-go")
	})
}

// fetchBackoff is the pause after the n-th consecutive fetch failure:
// 100 ms doubling up to 5 s.
func fetchBackoff(n int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < n && d < 5*time.Second; i++ {
		d *= 2
	}
	return min(d, 5*time.Second)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
